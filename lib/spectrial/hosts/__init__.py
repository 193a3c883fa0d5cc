"""Hosts: one verb set over local, SSH and Slurm job steps; tunnels, connecting, the machine's fingerprint, GPUs; `memory.MemoryHost`, the labelled in-memory test double."""
