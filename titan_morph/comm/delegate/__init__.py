"""The delegated data plane (paper §5.2): a send is copied into a shared-memory slot and returns at
once; delegate processes move it over their own Gloo groups.

* :mod:`.transport`: :class:`DelegateTransport`, the trainer's side;
* :mod:`.pool`: the delegate processes, their start-up, health and exit;
* :mod:`.slots`: the trainer's data path into and out of the rings (CPU and CUDA copies);
* :mod:`.worker`: the delegate process itself and the wire format of its commands;
* :mod:`.shm`: the shared-memory rings and their slot states.
"""
