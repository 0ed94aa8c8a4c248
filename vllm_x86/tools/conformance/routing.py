"""Is a quantized conformance failure a MoE routing near tie? A diagnosis, not a test.

    python -m vllm_x86.tools.conformance.routing ARCH METHOD [N]

METHOD is ``x86_int8``, ``x86_int4`` or ``none`` (bf16). The tiny checkpoint of ARCH
(conformance.prepare) runs through vLLM in bf16 with METHOD, eager, and through the
transformers reference of the suite's quantized modes (float32, weights fake-quantized by
quant/fake.py). Forward hooks on the MoE routers (modules named ``gate`` or ``router``
with a [experts, hidden] weight) record their inputs on both sides over the prompt,
extended by vLLM's first N greedy tokens. For each MoE layer the reference's router
weight scores both inputs in float32 (sigmoid plus the correction bias where the model
has one, else the logits; top-k by ``num_experts_per_tok``) and the script prints where
the chosen experts differ and the reference's margin there (k-th minus (k+1)-th score).

Then the confirmation: the reference runs again with vLLM's router inputs at those
positions only (its routing becomes vLLM's, everything else stays its own), repeated
until no further position differs. If the reference then gives vLLM's greedy token and
prompt log-probabilities close to vLLM's, the difference was the choice of experts at
near ties, not the kernels. DeepSeek's group-limited routing (``n_group``,
``topk_group``) is modelled: a margin is then also the one between the groups.
"""

from __future__ import annotations

import json
import os
import re
import sys


def _layer(name: str) -> int:
    m = re.search(r"layers\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def _is_router(name: str, mod) -> bool:
    w = getattr(mod, "weight", None)
    return (
        name.split(".")[-1] in ("gate", "router")
        and "layers." in name
        and w is not None
        and w.dim() == 2
        and w.shape[0] <= 64  # experts, not a hidden-sized gate projection
    )


def main(argv: list[str]) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import torch
    from vllm import LLM, SamplingParams

    from vllm_x86.tools.conformance import conformance, tiny
    from vllm_x86.tools.conformance.archs import BY_NAME
    from vllm_x86.tools.conformance.fake_quant import fake_quantize

    arch, method = argv[0], argv[1]
    extra = int(argv[2]) if len(argv) > 2 else 0
    prep = conformance.prepare(BY_NAME[arch], modes=())
    cfg = json.loads(open(f"{prep.model_dir}/config.json").read())
    tcfg = cfg.get("text_config", cfg)
    topk = tcfg.get("num_experts_per_tok") or 2

    engine = dict(BY_NAME[arch].engine or {})
    if method != "none":
        engine["quantization"] = method
    llm = LLM(
        prep.model_dir,
        dtype="bfloat16",
        enforce_eager=True,
        max_model_len=conformance.MAX_MODEL_LEN,
        skip_tokenizer_init=True,
        enable_prefix_caching=False,
        seed=0,
        **engine,
    )
    seq = list(prep.prompt)
    if extra:
        sp = SamplingParams(temperature=0, max_tokens=extra, detokenize=False)
        out = llm.generate([{"prompt_token_ids": seq}], sp, use_tqdm=False)[0]
        seq += list(out.outputs[0].token_ids)
        print("sequence extended by vLLM's greedy tokens", seq[len(prep.prompt) :])

    got: dict[int, torch.Tensor] = {}  # layer -> vLLM's router input [tokens, hidden]

    def install(model) -> int:
        n = 0
        for name, mod in model.named_modules():
            if type(mod).__name__ == "GateLinear" or _is_router(name, mod):

                def hook(m, args, out, name=name):
                    x = args[0].detach()
                    x = x.reshape(-1, x.shape[-1])
                    if x.shape[0] == len(seq):  # the prefill of the whole sequence
                        got.setdefault(_layer(name), x.float().clone())

                mod.register_forward_hook(hook)
                n += 1
        return n

    print("vLLM routers hooked:", llm.apply_model(install))
    sp = SamplingParams(temperature=0, max_tokens=1, detokenize=False, prompt_logprobs=0)
    out = llm.generate([{"prompt_token_ids": seq}], sp, use_tqdm=False)[0]
    v_lp = torch.tensor([out.prompt_logprobs[i][seq[i]].logprob for i in range(1, len(seq))])
    v_tok = out.outputs[0].token_ids[0]

    ref = tiny._load(prep.model_dir, "float32")
    if method != "none":
        fake_quantize(ref, method)
    routers, bias, seen, force = {}, {}, {}, {}

    def pre(m, args, name):
        layer, x = _layer(name), args[0]
        if force.get(layer):
            flat = x.reshape(-1, x.shape[-1]).clone()
            rows = sorted(force[layer])
            flat[rows] = got[layer][rows].to(flat.dtype)
            x = flat.reshape(x.shape)
        seen.setdefault(layer, x.detach().reshape(-1, x.shape[-1]).float().clone())
        return (x, *args[1:])

    for name, mod in ref.named_modules():
        if _is_router(name, mod):
            routers[_layer(name)] = mod
            mod.register_forward_pre_hook(lambda m, a, name=name: pre(m, a, name))
        b = getattr(mod, "e_score_correction_bias", None)
        if b is not None:
            bias[_layer(name)] = b.detach().float()
    sigmoid = tcfg.get("scoring_func") == "sigmoid" or bool(bias)

    def run_ref():
        seen.clear()
        with torch.no_grad():
            logits = ref(torch.tensor([seq]), use_cache=False).logits[0].float()
        return torch.log_softmax(logits, -1)

    def compare(lp, label):
        r_lp = lp[:-1].gather(1, torch.tensor(seq[1:])[:, None])[:, 0]
        best = int(lp[-1].argmax())
        print(
            f"{label}: log-probs of the sequence off vLLM's by up to "
            f"{(r_lp - v_lp).abs().max().item():.3g}; next token {best} (vLLM {v_tok}, "
            f"{float(lp[-1][best] - lp[-1][v_tok]):.3g} below it here)"
        )

    n_group, topk_group = tcfg.get("n_group") or 1, tcfg.get("topk_group") or 1

    def limit_groups(scores):
        """DeepSeek's group-limited routing: only the experts of the `topk_group` best
        groups (a group's score: the sum of its best two) compete. Returns the masked
        scores and each row's margin between the last kept and the best dropped group."""
        inf = torch.full(scores.shape[:1], float("inf"))
        if n_group <= 1 or topk_group >= n_group:
            return scores, inf
        groups = scores.view(scores.shape[0], n_group, -1)
        gs = groups.topk(2, -1).values.sum(-1)
        top = gs.topk(topk_group + 1, -1)
        keep = torch.zeros_like(gs, dtype=torch.bool).scatter(1, top.indices[:, :topk_group], True)
        mask = keep.repeat_interleave(groups.shape[-1], 1)
        margin = top.values[:, topk_group - 1] - top.values[:, topk_group]
        return scores.masked_fill(~mask, float("-inf")), margin

    def differences(verbose: bool) -> dict[int, list[int]]:
        found = {}
        for layer in sorted(routers):
            if layer not in got or layer not in seen:
                print(f"layer {layer}: no router input recorded (vLLM {layer in got})")
                continue
            w = routers[layer].weight.detach().float()
            sr, sv = seen[layer] @ w.T, got[layer] @ w.T
            if sigmoid:
                sr, sv = sr.sigmoid() + bias.get(layer, 0), sv.sigmoid() + bias.get(layer, 0)
            delta = (sv - sr).abs().max().item()
            sr, group_margin = limit_groups(sr)
            sv, _ = limit_groups(sv)
            top = sr.topk(topk + 1, -1)
            margin = torch.minimum(top.values[:, topk - 1] - top.values[:, topk], group_margin)
            diff = [
                p
                for p in range(len(seq))
                if set(top.indices[p, :topk].tolist()) != set(sv[p].topk(topk).indices.tolist())
            ]
            found[layer] = diff
            if verbose:
                print(
                    f"layer {layer}: scores differ by up to {delta:.3g}; "
                    f"experts differ at positions {diff}, where the reference's margins are "
                    f"{[round(margin[p].item(), 4) for p in diff]}"
                )
        return found

    print(f"{arch} {method}: top-{topk}, {'sigmoid' if sigmoid else 'softmax'} routing")
    lp = run_ref()
    compare(lp, "reference")
    found = differences(True)
    for _ in range(8):
        new = [(k, p) for k, ps in found.items() for p in ps if p not in force.get(k, ())]
        if not new:
            break
        for k, p in new:
            force.setdefault(k, set()).add(p)
        lp = run_ref()
        found = differences(False)
    if force:
        print(
            "vLLM's router inputs given to the reference at",
            {k: sorted(v) for k, v in force.items()},
        )
        compare(lp, "reference routed as vLLM")


if __name__ == "__main__":
    main(sys.argv[1:])
