"""ggml-cpu, the CPU backend: every op's NumPy reference (``ops``), the x86 kernels' float order
(``kernels``), ggml-cpu's type traits and activation quantizers (``quants``), REPACK and threads."""
