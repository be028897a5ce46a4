"""Record a jax.profiler XPlane with StepTraceAnnotation steps 5-8 (a real GPU step-marker fixture).

    python3 gpu/jax_steps.py OUTDIR
"""

import os
import sys

import jax
import jax.numpy as jnp

out = sys.argv[1]
x = jnp.ones((64, 32, 32, 64))
w = jnp.ones((3, 3, 64, 64))
f = jax.jit(lambda x, w: jax.nn.relu(jax.lax.conv_general_dilated(
    x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))))
f(x, w).block_until_ready()
jax.profiler.start_trace(os.path.join(out, "jax_steps"))
for s in range(5, 9):
    with jax.profiler.StepTraceAnnotation("train", step_num=s):
        f(x, w).block_until_ready()
jax.profiler.stop_trace()
