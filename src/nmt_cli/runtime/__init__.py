"""The machine: precisions, CPU cores and threads, device memory, and the defaults per device."""
