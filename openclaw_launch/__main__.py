from openclaw_launch.cli.main import main

main()
