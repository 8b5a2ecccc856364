"""Testing a change: a trial of a proposal, the switchback judge that decides it from paired blocks, and fleet
canaries judged against the replicas that kept the incumbent."""
