"""One run wired end to end: the launch in order, the agents of a multi-node job, the participants
supervision asks, and the node's and job's reports. The stage above everything a run composes."""
