"""The config against the live host: per GPU, fabric health, result types."""
