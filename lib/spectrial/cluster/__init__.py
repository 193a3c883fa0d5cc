"""Clusters: a trial's arms or a sweep's settings run as parallel units on Slurm or a pool of hosts.

    params      ClusterParams (`cluster:` in a params file): executor, units, max_parallel, slurm/pool options
    executor    the executor interface (submit, poll, cancel) and a unit's typed state
    slurm       sbatch / squeue / scontrol / scancel (Slurm does the resource management)
    pool        a list of hosts, one unit per host at a time (local processes driving each host)
    fanout      units from params, the run loop (parallel, faults, interrupts), the merged record
"""
