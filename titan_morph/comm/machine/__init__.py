"""What the transports need of the machine: OS helpers (:mod:`.system`: prctl, /proc, signals,
/dev/shm), the accelerator (:mod:`.devices`: binding a thread to the rank's device, stream marks) and
device-side timestamps of sends (:mod:`.stamps`)."""
