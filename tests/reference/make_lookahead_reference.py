"""What the predictor of a hybrid model (a shared expert beside the routed ones) should see for
the next layer's router: for the last token of the fixture's prompt plus its first forced token,
at every MoE layer l, post_attention_layernorm_l(residual + sigmoid(gate . hn) * shared(hn)),
the residual being the stream after layer l's token mixer and hn the MoE block's normed input.
Also hn itself, so a test can tell the two apart. Computed with transformers from the fixture's
own checkpoint (float32 from its bf16 weights).

usage: python make_lookahead_reference.py tests/fixtures/qwen35 [tests/fixtures/next ...]
writes lookahead.json beside each checkpoint.

The tree keeps large fixtures packed (tests/reference/pack_fixtures.py): `unpack` before
this, `pack` after.
"""
import json
import os
import sys

import torch
import transformers
from safetensors import safe_open


def text_model(m):
    inner = m.model
    return inner.language_model if hasattr(inner, "language_model") else inner


def make(path):
    with safe_open(os.path.join(path, "reference.safetensors"), "pt") as f:
        ids = f.get_tensor("input_ids").tolist() + f.get_tensor("forced_ids").tolist()[:1]
    cfg = transformers.AutoConfig.from_pretrained(path)
    arch = cfg.architectures[0]
    cls = getattr(transformers, arch)
    m = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                            experts_implementation="eager").eval()
    layers = text_model(m).layers
    got = {}

    # the hook sees the residual after the mixer: the input of post_attention_layernorm
    for l, layer in enumerate(layers):
        if not hasattr(layer.mlp, "shared_expert_gate"):
            got[l] = None  # a dense MLP layer: no MoE block, no prediction from it
            continue

        def pre_norm(mod, args, l=l, layer=layer):
            resid = args[0]
            hn = layer.post_attention_layernorm.__class__.forward(layer.post_attention_layernorm, resid)
            mlp = layer.mlp
            x = hn.reshape(-1, hn.shape[-1])
            shared = torch.sigmoid(mlp.shared_expert_gate(x)) * mlp.shared_expert(x)
            r = resid.reshape(-1, resid.shape[-1])[-1] + shared[-1]
            la = layer.post_attention_layernorm.__class__.forward(layer.post_attention_layernorm, r.view(1, 1, -1))
            got[l] = dict(moe_input=hn.reshape(-1, hn.shape[-1])[-1].tolist(), lookahead=la.reshape(-1).tolist())
        layer.post_attention_layernorm.register_forward_pre_hook(pre_norm)
    with torch.no_grad():
        m(input_ids=torch.tensor([ids]), use_cache=False)
    out = dict(
        note="last token of input_ids + forced_ids[:1]: per MoE layer, its normed input and the "
             "next router's lookahead (normed residual plus the gated shared expert); null for a dense layer",
        tokens=len(ids),
        layers=[got[l] for l in range(len(layers))],
        versions=dict(torch=torch.__version__, transformers=transformers.__version__),
    )
    with open(os.path.join(path, "lookahead.json"), "w") as f:
        json.dump(out, f)
    print(path, len(ids), "tokens,", len(layers), "layers")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        make(p)
