from openclaw_launch.cli import main

main()
