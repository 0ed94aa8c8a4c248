"""Mamba-1 mixers (Mamba, FalconMamba, Jamba) on CPU.

vLLM 0.32's ``MambaMixer.forward_impl`` (vllm/model_executor/layers/mamba/mamba_mixer.py)
does not run on vLLM's CPU build, for three reasons, one per stage:

1. prefill scan: it calls ``torch.ops._C.selective_scan_fwd`` (mamba_ssm.py:811), a
   CUDA kernel the CPU build does not have (AttributeError);
2. convolution: in bf16 on CPUs with AVX-512-BF16, vLLM's CPU Linear dispatch packs
   every [dim, 1, 4] conv weight in place for its packed GDN conv kernels
   (model_executor/layers/utils.py:489-516), but ``forward_impl`` reads
   ``conv1d.weight`` as [dim, 1, width] (mamba_mixer.py:288-290: IndexError) and its
   conv ops (``causal_conv1d_fn_cpu``, ``causal_conv1d_update_cpu``) want the unpacked
   layout. vLLM's Mamba-2 mixer escapes this by keeping a view of the unpacked weight
   taken in ``__init__`` (mamba_mixer2.py:473-476); the packing keeps an unpacked copy
   in ``conv1d._cpu_unpacked_conv_weight`` for such users;
3. decode: it calls ``ssu_dispatch.selective_state_update``, whose CPU backend hands
   the [slots, dim, dstate] Mamba-1 state straight to ``_C.selective_state_update_cpu``,
   which wants Mamba-2's [slots, heads, headdim, dstate] (IndexError). Given a head axis
   of 1 (vLLM's wrapper ``ops/cpu/mamba_ssm.selective_state_update`` adds one), that
   kernel still does not compute the Mamba-1 recurrence (tests/unit/test_mamba.py).

``MambaMixer`` is a vLLM ``PluggableLayer``: vLLM's way for a platform to replace the
whole layer class out of tree. The op table (ops/registry.py, a ``layer`` row) replaces
it with a subclass whose ``forward_impl`` is vLLM's, step for step, with those three
calls changed: the plugin's ``selective_scan_fwd`` and ``selective_state_update`` below,
and the unpacked conv weight for vLLM's CPU conv ops; and the inputs of ``x_proj`` and
``out_proj`` are made contiguous, as vLLM does for ROCm and LoRA (mamba_mixer.py:198,
409): its [tokens, dim] activations are transposed views of [dim, tokens] tensors, and
vLLM's CPU GEMMs (oneDNN, the packed bf16 linear) want rows contiguous. Nothing else
in the mixer changes.

``torch.ops.vllm_x86.selective_scan_fwd`` has vLLM's ``_C.selective_scan_fwd`` schema
and contract (the CUDA kernel csrc/mamba/mamba_ssm/selective_scan_fwd.cu): it writes the
scan output y into ``delta``, y * silu(z) into ``z``, and the final state of each
sequence into ``ssm_states[cache_indices[i]]``. ``selective_state_update`` is the
one-token step for the decode batch, with the argument order of vLLM's CPU op. Both are
vectorized torch in float32 (the scan sequential over time, parallel over channels and
state); their references are in ops/reference.py (tests/unit/test_mamba.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_x86.runtime.ops import schemas  # noqa: F401  (the ops' schemas, first)

# The time steps whose discretized A and B*u are materialized at once: bounds the
# temporaries to BLOCK x dim x dstate floats (12 MiB for Mamba-130m's 1536 x 16).
BLOCK = 128


def _sequences(u, query_start_loc) -> list[tuple[slice, int | None]]:
    """Where each sequence is: varlen (u [dim, T], B and C [groups, dstate, T]) a span
    of the last axis from query_start_loc; batched (u [batch, dim, L], B and C [batch,
    groups, dstate, L]) an index of the first."""
    if query_start_loc is None:
        return [(slice(None), b) for b in range(u.shape[0])]
    bounds = query_start_loc.tolist()
    return [(slice(bounds[i], bounds[i + 1]), None) for i in range(len(bounds) - 1)]


def _pick(t: torch.Tensor | None, span: slice, b: int | None) -> torch.Tensor | None:
    if t is None:
        return None
    return t[..., span] if b is None else t[b]


def check_unsupported(**apc) -> None:
    """vLLM's Mamba-1 mixer passes none of the prefix-caching arguments; the CUDA
    kernel uses them to write intermediate states per cache block. Not done here."""
    given = [name for name, value in apc.items() if value is not None]
    if given:
        raise NotImplementedError(
            "vllm-x86 selective_scan_fwd: prefix caching of Mamba-1 states "
            f"({', '.join(given)}) is not implemented on CPU"
        )


def selective_scan_fwd(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D_: torch.Tensor | None,
    z_: torch.Tensor | None,
    delta_bias_: torch.Tensor | None,
    delta_softplus: bool,
    query_start_loc: torch.Tensor | None,
    cache_indices: torch.Tensor | None,
    has_initial_state: torch.Tensor | None,
    ssm_states: torch.Tensor,
    null_block_id: int,
    block_size: int = 1024,
    block_idx_first_scheduled_token: torch.Tensor | None = None,
    block_idx_last_scheduled_token: torch.Tensor | None = None,
    initial_state_idx: torch.Tensor | None = None,
    cu_chunk_seqlen: torch.Tensor | None = None,
    last_chunk_indices: torch.Tensor | None = None,
) -> None:
    check_unsupported(
        block_idx_first_scheduled_token=block_idx_first_scheduled_token,
        block_idx_last_scheduled_token=block_idx_last_scheduled_token,
        initial_state_idx=initial_state_idx,
        cu_chunk_seqlen=cu_chunk_seqlen,
        last_chunk_indices=last_chunk_indices,
    )
    Af = A.float()
    dim, dstate = Af.shape
    D = D_.float() if D_ is not None else None
    bias = delta_bias_.float() if delta_bias_ is not None else None
    slots = cache_indices.tolist() if cache_indices is not None else None
    initial = has_initial_state.tolist() if has_initial_state is not None else None
    for i, (span, b) in enumerate(_sequences(u, query_start_loc)):
        slot = slots[i] if slots is not None else i
        if slot == null_block_id:
            continue
        us, ds = _pick(u, span, b), _pick(delta, span, b)
        Bs, Cs, zs = _pick(B, span, b), _pick(C, span, b), _pick(z_, span, b)
        length = us.shape[-1]
        if length == 0:
            continue
        groups = Bs.shape[0]
        dt = ds.float()
        if bias is not None:
            dt = dt + bias[:, None]
        if delta_softplus:
            dt = F.softplus(dt)  # log1p(exp(x)) for x <= 20, x above: the kernel's rule
        uf = us.float()
        dtu = (dt * uf).t()  # [L, dim]
        dtt = dt.t()
        # B, C [groups, dstate, L] -> [L, groups, 1, dstate]; channel d uses group
        # d // (dim / groups)
        Bt = Bs.float().permute(2, 0, 1).unsqueeze(2)
        Ct = Cs.float().permute(2, 0, 1).unsqueeze(2)
        if initial is not None and initial[i]:
            h = ssm_states[slot].float().reshape(dim, dstate).clone()
        else:
            h = torch.zeros(dim, dstate, dtype=torch.float32, device=u.device)
        y = torch.empty(length, dim, dtype=torch.float32, device=u.device)
        for t0 in range(0, length, BLOCK):
            t1 = min(t0 + BLOCK, length)
            n = t1 - t0
            dA = torch.exp(dtt[t0:t1, :, None] * Af)  # [n, dim, dstate]
            dBu = (dtu[t0:t1].reshape(n, groups, -1, 1) * Bt[t0:t1]).reshape(n, dim, dstate)
            hs = torch.empty_like(dA)
            for k in range(n):
                h = torch.addcmul(dBu[k], dA[k], h, out=hs[k])
            h = h.clone()  # hs is scaled by C in place below
            yc = hs.reshape(n, groups, -1, dstate).mul_(Ct[t0:t1]).sum(-1)
            y[t0:t1] = yc.reshape(n, dim)
        y = y.t()  # [dim, L]
        if D is not None:
            y = y + D[:, None] * uf
        ds.copy_(y)
        if zs is not None:
            zf = zs.float()
            zs.copy_(y * (zf * torch.sigmoid(zf)))
        ssm_states[slot].copy_(h.reshape(ssm_states[slot].shape))


def _slots(indices: torch.Tensor | None, batch: int, device) -> torch.Tensor:
    if indices is None:
        return torch.arange(batch, device=device)
    return indices.reshape(batch, -1)[:, 0].long()


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    state_batch_indices: torch.Tensor | None,
    dst_state_batch_indices: torch.Tensor | None,
    null_block_id: int,
    out: torch.Tensor,
) -> None:
    """Mamba-1 decode: one step of the recurrence for every sequence at once. state
    [slots, dim, dstate]; x, dt, z, out [batch, dim]; B, C [batch, dstate]; A [dim,
    dstate]; D, dt_bias [dim]. vLLM's CPU kernel (_C.selective_state_update_cpu) is
    written for Mamba-2's [slots, heads, headdim, dstate] states; given Mamba-1's
    through vLLM's wrapper (a head axis of 1) its results differ from the recurrence
    (tests/unit/test_mamba.py::test_vllm_cpu_state_update_is_wrong_for_mamba1)."""
    if state.dim() != 3 or x.dim() != 2:
        raise NotImplementedError(
            "vllm-x86 selective_state_update: Mamba-1 shapes only (state [slots, dim, "
            f"dstate], x [batch, dim]); got state {tuple(state.shape)}, x {tuple(x.shape)}"
        )
    batch = x.shape[0]
    src = _slots(state_batch_indices, batch, x.device)
    dst = _slots(
        dst_state_batch_indices if dst_state_batch_indices is not None else state_batch_indices,
        batch,
        x.device,
    )
    keep = src != null_block_id
    if not bool(keep.all()):
        src, dst = src[keep], dst[keep]
    dtf = dt.float()[keep]
    if dt_bias is not None:
        dtf = dtf + dt_bias.float()
    if dt_softplus:
        dtf = F.softplus(dtf)
    xf = x.float()[keep]
    h = state[src].float()
    h = (
        torch.exp(dtf[:, :, None] * A.float()) * h
        + (dtf * xf)[:, :, None] * B.float()[keep][:, None, :]
    )
    y = (h * C.float()[keep][:, None, :]).sum(-1)
    if D is not None:
        y = y + D.float() * xf
    if z is not None:
        zf = z.float()[keep]
        y = y * (zf * torch.sigmoid(zf))
    state[dst] = h.to(state.dtype)
    out[keep] = y.to(out.dtype)


_defined = False


def define_ops() -> None:
    """The CPU implementations of torch.ops.vllm_x86.selective_scan_fwd and
    selective_state_update (idempotent); their schemas and fakes are ops/schemas.py's."""
    global _defined
    if _defined:
        return
    _defined = True
    torch.library.impl("vllm_x86::selective_scan_fwd", "CPU")(selective_scan_fwd)
    torch.library.impl("vllm_x86::selective_state_update", "CPU")(selective_state_update)


define_ops()


def _conv_weight(layer) -> torch.Tensor:
    """The [dim, width] conv weight vLLM's CPU conv ops read, also where vLLM's CPU
    Linear dispatch packed ``conv1d.weight`` and kept the unpacked copy aside."""
    w = getattr(layer.conv1d, "_cpu_unpacked_conv_weight", None)
    if w is not None:
        return w
    w = layer.conv1d.weight
    return w.view(w.size(0), w.size(2))


class X86MambaMixerMixin:
    """vLLM 0.32's ``MambaMixer.forward_impl`` with the plugin's scan and state update
    and the unpacked conv weight (module docstring)."""

    def forward_impl(self, hidden_states: torch.Tensor, output: torch.Tensor):
        from vllm.forward_context import get_forward_context
        from vllm.model_executor.layers.mamba.mamba_mixer import (
            split_batch_to_prefill_and_decode,
        )
        from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
        from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import (
            causal_conv1d_fn_cpu,
            causal_conv1d_update_cpu,
        )

        attn_metadata = get_forward_context().attn_metadata
        if attn_metadata is not None:
            attn_metadata = attn_metadata.get(self.prefix)

        projected_states = self.in_proj(hidden_states)[0].transpose(-2, -1)
        hidden_states_BC, gate = projected_states.chunk(2, dim=-2)

        if attn_metadata is None:  # profile run
            return self.out_proj(hidden_states_BC.transpose(-2, -1).contiguous())[0]

        conv_weights = _conv_weight(self)
        conv_state = (
            self.kv_cache[0] if is_conv_state_dim_first() else self.kv_cache[0].transpose(-1, -2)
        )
        ssm_state = self.kv_cache[1]
        num_prefill_tokens = attn_metadata.num_prefill_tokens
        num_decode_tokens = attn_metadata.num_decode_tokens
        num_actual_tokens = num_prefill_tokens + num_decode_tokens
        split = split_batch_to_prefill_and_decode(
            hidden_states_BC, gate, num_prefill_tokens, num_decode_tokens
        )
        ssm_outputs = []
        time_proj_bias = self._time_proj_bias()

        if num_prefill_tokens > 0:
            conv_out_p = causal_conv1d_fn_cpu(
                split.hidden_states_BC_p,
                conv_weights,
                self.conv1d.bias,
                activation=self.activation,
                conv_states=conv_state,
                has_initial_state=attn_metadata.has_initial_states_p,
                cache_indices=attn_metadata.state_indices_tensor_p,
                query_start_loc=attn_metadata.query_start_loc_p,
                metadata=attn_metadata,
            )
            dt_p, B_p, C_p = self._ssm_transform(conv_out_p.transpose(-2, -1).contiguous())
            # vLLM's selective_scan_fn: contiguous last axes, B and C as [1, dstate, T]
            z_p = split.gate_p.contiguous()
            dt_p = dt_p.contiguous()
            torch.ops.vllm_x86.selective_scan_fwd(
                conv_out_p.contiguous(),
                dt_p,
                self.A,
                B_p.transpose(-2, -1).contiguous().unsqueeze(0),
                C_p.transpose(-2, -1).contiguous().unsqueeze(0),
                self.D.float(),
                z_p,
                time_proj_bias,
                True,
                attn_metadata.query_start_loc_p,
                attn_metadata.state_indices_tensor_p,
                attn_metadata.has_initial_states_p,
                ssm_state,
                0,  # NULL_BLOCK_ID, selective_scan_fn's default
            )
            ssm_outputs.append(z_p)

        if num_decode_tokens > 0:
            state_indices_d = attn_metadata.state_indices_tensor_d
            conv_out_d = causal_conv1d_update_cpu(
                split.hidden_states_BC_d.transpose(0, 1),
                conv_state,
                conv_weights,
                self.conv1d.bias,
                self.activation,
                conv_state_indices=state_indices_d,
            ).transpose(0, 1)
            dt_d, B_d, C_d = self._ssm_transform(conv_out_d.transpose(-2, -1).contiguous())
            scan_outputs_d = torch.empty_like(split.hidden_states_BC_d.transpose(0, 1))
            torch.ops.vllm_x86.selective_state_update(
                ssm_state,
                conv_out_d.transpose(0, 1),
                dt_d.transpose(0, 1),
                self.A,
                B_d,
                C_d,
                self.D,
                split.gate_d.transpose(0, 1),
                time_proj_bias,
                True,
                state_indices_d,
                state_indices_d,
                0,  # NULL_BLOCK_ID
                scan_outputs_d,
            )
            ssm_outputs.insert(0, scan_outputs_d.transpose(0, 1))

        combined = ssm_outputs[0] if len(ssm_outputs) == 1 else torch.cat(ssm_outputs, dim=-1)
        out = self.out_proj(combined.transpose(-2, -1).contiguous())[0]
        output[:num_actual_tokens] = out
