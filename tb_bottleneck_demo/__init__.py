"""Demo-run generator for the Bottlenecks tab (``tb-bottlenecks demo OUTDIR``).

Real PyTorch training loops under ``torch.profiler`` that write a TensorBoard logdir
(see :mod:`tb_bottleneck_demo.generator`). This package sits beside the runtime package
``tb_bottleneck_plugin`` on purpose: TensorBoard, the routes and the CLI's ``report`` never
import it, and torch is needed only here (``pip install "tb_bottleneck_plugin[demo]"``).
It depends on the runtime package (for its error types), never the other way round
(tests/project/test_architecture.py checks both).
"""
