"""One job across nodes: the node agents (one launcher per node) meet before any worker starts,
share one fate while the job runs, restart together and report once.

``hostlist`` and ``fingerprint`` are pure; ``store`` wraps torch.distributed's TCPStore (imported
only here, only for a multi-node job); ``fate`` is the agent itself (a thread that talks to the
supervisor through a pipe); ``merge`` builds the job report on the first node.
"""
