"""Boards: the timing agent, its builds and protocol client, and the local, QEMU and SSH boards."""
