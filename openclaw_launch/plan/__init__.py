"""Config + Topology + options -> LaunchPlan, with no I/O: binding, environment, parallel groups."""
