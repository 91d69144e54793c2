"""Code generation: loop nests in, LLVM IR, relocatable ELF objects and flat images out."""
