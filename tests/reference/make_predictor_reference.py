"""What moescope's predictor should score on a fixture's decode: the prompt (input_ids) as one
pass, then each forced id as a pass of its own. At every decode position t and MoE layer l, with
x the MoE block's input (the post-attention-normed hidden state), the predictor guesses
  one ahead: top-k of softmax(router_(l+1) x), scored against layer l+1's route, and
  two ahead: top-k of softmax(router_(l+2) x), scored against layer l+2's route,
layers wrapping into the next position (which must be a decode position too: the route of a
prompt position is not scored). A route is the top-k of its own router on its own input. Both
are scored as moescope's `Recall` does (per routed slot, by gate weight, in all). Also the
number of scorings that hinge on a near tie (a k-th and (k+1)-th router probability within
1e-4, in the guess or the route), which float rounding may decide either way.

Computed with transformers in float32 from the fixture's bf16 checkpoint.

usage: python make_predictor_reference.py tests/fixtures/demo
writes predictor.json beside the checkpoint.

The tree keeps large fixtures packed (tests/reference/pack_fixtures.py): `unpack` before
this, `pack` after.
"""
import json
import os
import sys

import torch
import transformers
from safetensors import safe_open

TIE = 1e-4


def make(path):
    with safe_open(os.path.join(path, "reference.safetensors"), "pt") as f:
        prompt = f.get_tensor("input_ids").tolist()
        forced = f.get_tensor("forced_ids").tolist()
    ids = prompt + forced
    cfg = transformers.AutoConfig.from_pretrained(path)
    m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    k, n_layers = cfg.num_experts_per_tok, cfg.num_hidden_layers
    xs = {}
    for l, layer in enumerate(m.model.layers):
        def hook(mod, args, l=l):
            xs[l] = args[0].reshape(-1, args[0].shape[-1]).detach()
        layer.mlp.register_forward_pre_hook(hook)
    with torch.no_grad():
        m(input_ids=torch.tensor([ids]), use_cache=False)
    gates = [layer.mlp.gate.weight.detach().float() for layer in m.model.layers]

    def ranked(l, x):
        p = torch.softmax(x @ gates[l].T, dim=-1)
        v, i = torch.topk(p, k + 1)
        return i[:k].tolist(), (v[:k] / v[:k].sum()).tolist(), float(v[k - 1] - v[k])

    out = {}
    for ahead in (1, 2):
        r = dict(slot_routed=[0] * k, slot_predicted=[0] * k, gate_mass=0.0, gate_mass_predicted=0.0,
                 routed=0, routed_predicted=0, near_ties=0)
        for t in range(len(prompt), len(ids)):
            for l in range(n_layers):
                t2, l2 = t + (l + ahead) // n_layers, (l + ahead) % n_layers
                if t2 >= len(ids):
                    continue
                guess, _, gm = ranked(l2, xs[l][t])
                route, w, rm = ranked(l2, xs[l2][t2])
                r["near_ties"] += int(gm < TIE or rm < TIE)
                for j, (e, wj) in enumerate(zip(route, w)):
                    hit = e in guess
                    r["slot_routed"][j] += 1
                    r["slot_predicted"][j] += int(hit)
                    r["gate_mass"] += wj
                    r["routed"] += 1
                    if hit:
                        r["gate_mass_predicted"] += wj
                        r["routed_predicted"] += 1
        out["one_ahead" if ahead == 1 else "two_ahead"] = r
    out["note"] = ("predictor scoring on the decode of forced_ids after input_ids: one and two MoE layers ahead "
                   "(make_predictor_reference.py)")
    out["decode_tokens"] = len(forced)
    out["versions"] = dict(torch=torch.__version__, transformers=transformers.__version__)
    with open(os.path.join(path, "predictor.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(path, {a: (out[a]["routed_predicted"], out[a]["routed"], out[a]["near_ties"]) for a in ("one_ahead", "two_ahead")})


if __name__ == "__main__":
    for p in sys.argv[1:]:
        make(p)
