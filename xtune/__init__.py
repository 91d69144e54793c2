"""xtune: auto-tuned tensor kernels for embedded targets (x86 AVX2, ARM NEON, RISC-V)."""

__version__ = "0.1.0"
