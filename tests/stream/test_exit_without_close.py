"""A script that ends without engine.close() while held updates (clipping) still run on
the worker thread exits normally: before, the interpreter tore torch down under the
worker and the process aborted (exit 134, "terminate called without an active
exception")."""

import subprocess
import sys
import textwrap


def test_script_without_close_exits_cleanly():
    script = textwrap.dedent("""
        import torch, outcore
        from outcore.models import decoder
        torch.manual_seed(0)
        eng = outcore.Engine(decoder("small", max_seq=256), device="cpu", max_grad_norm=1.0)
        x = torch.randint(0, 256, (16, 256))
        print(eng.train_step({"input_ids": x, "labels": x}))
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "terminate called" not in p.stderr
