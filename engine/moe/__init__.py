"""Mixture of experts at run time: experts in physical slots (placement, replicas, capacity and drops) and expert
parallelism over torch.distributed ranks with its command channel."""
