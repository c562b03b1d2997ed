"""Lines the ``train`` command prints for a pipeline run (below the per-phase table)."""

from __future__ import annotations

from typing import Any

__all__ = ["mp_summary"]


def mp_summary(res: dict[str, Any]) -> dict[str, str]:
    """``label -> text`` rows: layout, per split bytes forward / backward per step and compression."""
    mp = res["mp"]
    rows = {"pipeline": f"{mp['stages']} stages x {mp['replicas']} replica(s), "
                        f"{mp['micro_batches']} micro-batch(es), dp-scheme {mp['dp_scheme']}"}
    rows["stage params"] = ", ".join(f"{p:,}" for p in mp["stage_parameters"])
    for j, s in enumerate(mp["splits"]):
        shape = "x".join(str(v) for v in s["activation_shape"])
        enc = ", ".join(f"{k} {v}" for k, v in sorted(s["mask_encodings"].items()))
        rows[f"split {j} fwd B"] = (f"{s['bytes_forward']:,.0f}/step (dense {s['dense_bytes_forward']:,.0f}, "
                                          f"{s['compression_forward']:.2f}x) after {s['after']} [{shape}]")
        rows[f"split {j} bwd B"] = (f"{s['bytes_backward']:,.0f}/step (dense {s['dense_bytes_backward']:,.0f}, "
                                          f"{s['compression_backward']:.2f}x)")
        tau = f", tau {s['tau_last']:.4g}" if "tau_last" in s else ""
        rows[f"split {j} occupancy"] = f"{s['occupancy']:.4f}{tau}" + (f"; messages: {enc}" if enc else "")
    rows["compression"] = f"{mp['compression_factor']:.2f}x of the dense activation + gradient bytes"
    if mp["replicas"] > 1 or mp["dp_scheme"] != "dense":
        dens = mp["dp_density_actual"]
        rows["dp bytes/rank"] = (f"{mp['dp_bytes_sent_per_rank']:,.0f} per step"
                                 + (f", density {dens:.5f}" if dens is not None else ""))
    return rows
