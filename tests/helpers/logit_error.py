"""How far the plugin's logits are from the float32 reference (docs/correctness.md).

For each configuration (bf16 or INT8, eager or compiled) it decodes the default model's
chat prompts greedily with vLLM's LLM class (raw logits of the top tokens at every
step), then runs transformers in float32 on the same prompt and the plugin's own tokens
(teacher-forced) and reports:

- the error of the plugin's logits at its top tokens (max and mean |plugin - fp32|),
- the steps where the plugin's greedy token is not the float32 argmax for the same
  prefix although the float32 top two are at least ``--margin`` apart ("mismatches"),
- per prompt, whether the plugin's tokens equal the float32 greedy continuation up to
  its first step with a margin below ``--margin`` (the parity test's rule).

With ``--attribute`` it instead says where a bf16 model's error comes from: transformers
in float32, with bf16 rounding put back at one kind of place at a time (every linear
layer's input, its output, the final norm's output, ...), teacher-forced on the float32
greedy tokens; each line is the error that rounding alone gives the distance between the
float32 top five logits (mean, 99th percentile, max).

Usage (the settings of the plugin come from the environment):
  python tests/helpers/logit_error.py --model DIR --configs bf16-eager,bf16-compiled
  python tests/helpers/logit_error.py --model DIR --attribute
"""

from __future__ import annotations

import argparse
import gc
import json
import sys

from tests.helpers import results

QUESTIONS = [
    "What is the capital of France?",
    "Explain why the sky is blue in two sentences.",
    "What is 12 times 7?",
    "Name three primary colors.",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water in Celsius?",
    "Give me a synonym for happy.",
    "How many legs does a spider have?",
    "What is the largest planet in our solar system?",
    "Translate 'good morning' into Spanish.",
]
TOP = 5


def prompt_ids(model_dir: str, questions=QUESTIONS) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for q in questions
    ]


_VLLM = r"""
import gc, json, sys
from vllm import LLM, SamplingParams
model, prompts, new, configs = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
out = {}
for cfg in configs.split(","):
    quant, mode = cfg.split("-")
    kw = {"quantization": "x86_int8"} if quant == "int8" else {}
    llm = LLM(model, dtype="bfloat16", enforce_eager=mode == "eager", max_model_len=1024,
              seed=0, logprobs_mode="raw_logits", max_logprobs=TOP, **kw)
    sp = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True, logprobs=TOP)
    runs = []
    for ids in prompts:
        o = llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)[0].outputs[0]
        runs.append({"tokens": list(o.token_ids),
                     "top": [{str(t): lp.logprob for t, lp in step.items()} for step in o.logprobs]})
    out[cfg] = runs
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
print("RESULT " + json.dumps(out), flush=True)
""".replace("TOP", str(TOP))


def run_plugin(model_dir: str, prompts, new: int, configs: str, env=None) -> dict:
    return results.run(
        [sys.executable, "-c", _VLLM, model_dir, json.dumps(prompts), str(new), configs],
        env=env,
        timeout=3000,
    )


class Reference:
    """transformers in float32 on the model's (bf16-exact) weights."""

    def __init__(self, model_dir: str):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def logits(self, ids: list[int], cont: list[int]):
        """float32 logits predicting each token of `cont` (teacher-forced), [len(cont), V]."""
        with self.torch.no_grad():
            x = self.torch.tensor([ids + cont])
            return self.model(x).logits[0, len(ids) - 1 : len(ids) + len(cont) - 1].float()

    def greedy(self, ids: list[int], new: int) -> tuple[list[int], list[float]]:
        """float32 greedy continuation and its top-two margin at every step."""
        torch = self.torch
        with torch.no_grad():
            out = self.model(torch.tensor([ids]), use_cache=True)
            toks, margins = [], []
            for _ in range(new):
                last = out.logits[0, -1].float()
                top = last.topk(2)
                toks.append(int(top.indices[0]))
                margins.append(float(top.values[0] - top.values[1]))
                out = self.model(
                    torch.tensor([[toks[-1]]]), past_key_values=out.past_key_values, use_cache=True
                )
        return toks, margins


def agrees_until_tie(got: list[int], want: list[int], margins: list[float], margin: float):
    """(ok, first differing step or None, first step with a margin below `margin` or None)."""
    tie = next((k for k, m in enumerate(margins) if m < margin), None)
    diff = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
    end = len(want) if tie is None else tie
    return (diff is None or diff >= end), diff, tie


def analyse(ref: Reference, prompts, plugin: dict, greedy, margin: float) -> dict:
    report = {}
    for cfg, runs in plugin.items():
        errs, gaps, mism, checked, rule = [], [], [], 0, []
        for i, (ids, run) in enumerate(zip(prompts, runs)):
            lg = ref.logits(ids, run["tokens"])
            for k, (tok, top) in enumerate(zip(run["tokens"], run["top"])):
                for t, v in top.items():
                    errs.append(abs(v - float(lg[k, int(t)])))
                    # the error of its distance to the chosen token's logit: what
                    # decides a choice (a shift common to all logits does not)
                    if str(tok) in top and int(t) != tok:
                        gaps.append(abs((v - top[str(tok)]) - float(lg[k, int(t)] - lg[k, tok])))
                t2 = lg[k].topk(2)
                m = float(t2.values[0] - t2.values[1])
                if m >= margin:
                    checked += 1
                    if tok != int(t2.indices[0]):
                        mism.append(
                            {
                                "prompt": i,
                                "step": k,
                                "got": tok,
                                "fp32": int(t2.indices[0]),
                                "fp32_margin": round(m, 4),
                            }
                        )
            ok, diff, tie = agrees_until_tie(run["tokens"], greedy[i][0], greedy[i][1], margin)
            rule.append({"prompt": i, "ok": ok, "first_diff": diff, "first_tie": tie})
        errs.sort()
        gaps.sort()
        report[cfg] = {
            "max_abs_err": round(errs[-1], 4),
            "mean_abs_err": round(sum(errs) / len(errs), 4),
            "p99_abs_err": round(errs[int(0.99 * (len(errs) - 1))], 4),
            "max_gap_err": round(gaps[-1], 4),
            "mean_gap_err": round(sum(gaps) / len(gaps), 4),
            "p99_gap_err": round(gaps[int(0.99 * (len(gaps) - 1))], 4),
            # the smallest margin for which the parity test's rule holds on every prompt
            "rule_needs_margin": round(
                max(
                    (
                        min(greedy[r["prompt"]][1][: r["first_diff"] + 1])
                        for r in rule
                        if r["first_diff"] is not None
                    ),
                    default=0.0,
                ),
                4,
            ),
            "steps_with_margin": checked,
            "mismatches": mism,
            "rule_failures": [r for r in rule if not r["ok"]],
            "rule": rule,
        }
    return report


# --attribute: where bf16 rounding is put back, by the names of the linear layers it
# touches ("in": their input, "out": their output) or the final norm's output
ROUNDING_SITES = {
    "every linear layer's input": [("in", "")],
    "every linear layer's output": [("out", "")],
    "final norm's output (LM head input)": [("norm", "")],
    "q/k/v and gate/up inputs (norm outputs)": [
        ("in", ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))
    ],
    "o_proj input (attention output)": [("in", "o_proj")],
    "down_proj input (SiLU x mul)": [("in", "down_proj")],
    "q/k/v outputs (rotary, KV cache)": [("out", ("q_proj", "k_proj", "v_proj"))],
    "gate/up outputs": [("out", ("gate_proj", "up_proj"))],
    "o/down outputs (into the residual)": [("out", ("o_proj", "down_proj"))],
    "all of the above": [("in", ""), ("out", ""), ("norm", "")],
}


def attribute(ref: Reference, prompts, greedy) -> dict[str, dict[str, float]]:
    """The error of the distance between the float32 top-5 logits (to the best) with bf16
    rounding at each of ROUNDING_SITES alone, teacher-forced on the float32 tokens."""
    torch = ref.torch
    model = ref.model
    bf = lambda t: t.to(torch.bfloat16).to(t.dtype)  # noqa: E731
    linears = [(n, m) for n, m in model.model.named_modules() if isinstance(m, torch.nn.Linear)]
    base = [ref.logits(ids, g[0]) for ids, g in zip(prompts, greedy)]
    out = {}
    for name, sites in ROUNDING_SITES.items():
        hooks = []
        for where, suffix in sites:
            if where == "norm":
                hooks.append(model.model.norm.register_forward_hook(lambda m, a, o: bf(o)))
            for n, m in linears:
                if not n.endswith(suffix):
                    continue
                if where == "in":
                    hooks.append(m.register_forward_pre_hook(lambda m, a: (bf(a[0]),)))
                elif where == "out":
                    hooks.append(m.register_forward_hook(lambda m, a, o: bf(o)))
        try:
            gaps = []
            for ids, g, r in zip(prompts, greedy, base):
                lg = ref.logits(ids, g[0])
                top = r.topk(TOP).indices
                for k in range(len(g[0])):
                    b = top[k, 0]
                    d = (lg[k, top[k, 1:]] - lg[k, b]) - (r[k, top[k, 1:]] - r[k, b])
                    gaps += d.abs().tolist()
        finally:
            for h in hooks:
                h.remove()
        gaps.sort()
        out[name] = {
            "mean": round(sum(gaps) / len(gaps), 4),
            "p99": round(gaps[int(0.99 * (len(gaps) - 1))], 4),
            "max": round(gaps[-1], 4),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--configs", default="bf16-eager,bf16-compiled,int8-eager,int8-compiled")
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--margin", type=float, default=0.05)
    p.add_argument("--out", default=None)
    p.add_argument("--reanalyse", default=None, help="a earlier --out file: its vLLM runs")
    p.add_argument("--attribute", action="store_true", help="where bf16's error comes from")
    a = p.parse_args()
    prompts = prompt_ids(a.model)
    if a.attribute:
        ref = Reference(a.model)
        greedy = [ref.greedy(ids, a.new) for ids in prompts]
        for name, r in attribute(ref, prompts, greedy).items():
            print(f"{name:40s} mean {r['mean']:.4f}  p99 {r['p99']:.4f}  max {r['max']:.4f}")
        return
    if a.reanalyse:
        with open(a.reanalyse) as f:
            plugin = json.load(f)["plugin"]
    else:
        plugin = run_plugin(a.model, prompts, a.new, a.configs)
    gc.collect()
    ref = Reference(a.model)
    greedy = [ref.greedy(ids, a.new) for ids in prompts]
    report = analyse(ref, prompts, plugin, greedy, a.margin)
    summary = {
        cfg: {k: (len(v) if isinstance(v, list) else v) for k, v in r.items() if k != "rule"}
        for cfg, r in report.items()
    }
    print(json.dumps(summary, indent=1))
    for cfg, r in report.items():
        for m in r["mismatches"]:
            print(cfg, "mismatch", m)
        for f in r["rule_failures"]:
            print(cfg, "rule failure", f)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"report": report, "plugin": plugin, "greedy": greedy}, f)


if __name__ == "__main__":
    main()
