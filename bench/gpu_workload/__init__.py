"""A verl-shaped RL job on real GPUs, with one switch per fault (see ``job.py``).

Built from PyTorch and transformers only (both are on the GPU machine; nothing is downloaded):
a small causal LM with random weights, batches from a ``DataLoader`` fetched before the step
timer starts (as verl's fit loop does), rollout with ``generate`` and variable response
lengths, ``old_log_prob`` and ``ref`` forward passes, an actor update across ranks through
NCCL (DDP), and a weight sync from the trainer copy to a separate rollout copy through NCCL.
The driver (rank 0) prints one verl 0.9.1 console line per step and, optionally, the file
logger's JSONL.
"""
