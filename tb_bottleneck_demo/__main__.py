"""``python -m tb_bottleneck_demo OUTDIR [--quick] [--device cpu|cuda]`` (= ``tb-bottlenecks demo``)."""
import sys

from tb_bottleneck_demo.generator import main

sys.exit(main())
