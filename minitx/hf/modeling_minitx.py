"""A minitx model as a transformers model: the custom code of an exported model directory.

`minitx export` copies this file into the directory of every model that no native transformers
class expresses (GELU MLPs, LayerNorm, learned positions, biases, local attention with global
tokens, multi-token attention, per-layer mixes of key/value head counts, Gated DeltaNet beside
softmax layers that Qwen3.5 cannot hold), so that

    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)

runs it without minitx installed. It needs only torch and transformers: nothing here may import
minitx. The parameter names are minitx's own, so the weights are minitx's state dict as it is.

Every attention is computed the plain, materialised way (the whole T x T score matrix; Gated
DeltaNet's recurrence token by token), which is what minitx's tests hold its fast paths to. There is no KV cache: `generate` re-runs the whole
sequence at every step, which is exact for every kind and slow for long outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast


class MinitxConfig(PreTrainedConfig):
    """minitx's ModelConfig fields, with `attention` a plain dict of AttentionConfig's fields."""

    model_type = "minitx"
    attribute_map = {
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
    }

    def __init__(
        self,
        vocab_size=65,
        block_size=256,
        n_layer=4,
        n_head=4,
        d_model=128,
        mlp="gelu",
        mlp_hidden=None,
        norm="rmsnorm",
        norm_eps=1e-6,
        positions="rope",
        rope_base=10000.0,
        bias=False,
        tie_embeddings=True,
        attention=None,
        **kwargs,
    ):
        self.vocab_size, self.n_layer, self.n_head, self.d_model = vocab_size, n_layer, n_head, d_model
        self.block_size = self.max_position_embeddings = block_size
        self.mlp, self.mlp_hidden, self.norm, self.norm_eps = mlp, mlp_hidden or 4 * d_model, norm, norm_eps
        self.positions, self.rope_base = positions, rope_base
        self.bias, self.tie_embeddings = bias, tie_embeddings
        self.attention = dict(attention or {"kind": "mha"})
        kwargs["tie_word_embeddings"] = tie_embeddings
        super().__init__(**kwargs)

    def layer_kind(self, layer: int) -> str:
        pattern = self.attention.get("layers") or [self.attention.get("kind", "mha")]
        return pattern[layer % len(pattern)]

    def kv_heads(self, layer: int) -> int:
        kind = self.layer_kind(layer)
        if kind == "mha":
            return self.n_head
        return 1 if kind == "mqa" else (self.attention.get("n_kv_head") or self.n_head)

    def option(self, kind: str, name: str, default):
        """An option of one attention kind, from minitx's `options: {kind: {name: value}}`."""
        return (self.attention.get("options") or {}).get(kind, {}).get(name, default)

    def has_mta_conv(self, layer: int) -> bool:
        layers = self.option("mta", "conv_layers", None)
        return layer in (range(2, self.n_layer, 4) if layers is None else layers)


def rope_tables(length: int, head_dim: int, base: float, device) -> tuple[Tensor, Tensor]:
    """cos, sin (T, D) for rotating the pairs (x[i], x[i + D/2]) by position * base^(-2i/D)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angles = torch.outer(torch.arange(length, dtype=torch.float32, device=device), inv_freq)
    return torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return (x.float() * cos + torch.cat([-x2, x1], dim=-1) * sin).type_as(x)


def visible(T: int, window: int | None, n_global: int, device) -> Tensor:
    """(T, T) bool: query i sees key j <= i, and with a window only i - window < j, or j < n_global."""
    i, j = torch.arange(T, device=device)[:, None], torch.arange(T, device=device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (i - j < window) | (j < n_global)
    return allowed


def make_norm(config: MinitxConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=config.norm_eps)
    return nn.LayerNorm(config.d_model, bias=config.bias)


class MLP(nn.Module):
    def __init__(self, config: MinitxConfig):
        super().__init__()
        self.swiglu = config.mlp == "swiglu"
        self.up = nn.Linear(config.d_model, config.mlp_hidden, bias=config.bias)
        self.gate = nn.Linear(config.d_model, config.mlp_hidden, bias=config.bias) if self.swiglu else None
        self.down = nn.Linear(config.mlp_hidden, config.d_model, bias=config.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x) if self.swiglu else F.gelu(self.up(x)))


class Attention(nn.Module):
    """MHA, MQA, GQA and local attention: one fused q/k/v projection, RoPE, a materialised mask;
    with the options every softmax kind has: QK-norm, learned sinks, an output gate."""

    def __init__(self, config: MinitxConfig, layer: int):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.kv_heads(layer)
        self.head_dim = config.d_model // config.n_head
        kind = config.layer_kind(layer)
        local = kind == "local"
        self.window = config.option("local", "window", 128) if local else None
        self.n_global = config.option("local", "n_global", 0) if local else 0
        inner, kv_inner = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        self.qkv_proj = nn.Linear(config.d_model, inner + 2 * kv_inner, bias=config.bias)
        self.out_proj = nn.Linear(inner, config.d_model, bias=config.bias)
        qk_norm = config.option(kind, "qk_norm", False)  # RMSNorm of each head's q and k before RoPE
        self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-6) if qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim, eps=1e-6) if qk_norm else None
        # one logit per head in every softmax row's denominator, read by no value
        self.sinks = nn.Parameter(torch.zeros(self.n_head)) if config.option(kind, "sinks", False) else None
        gates = {"elementwise": inner, "head": self.n_head}.get(config.option(kind, "gate", "none"), 0)
        self.gate_proj = nn.Linear(config.d_model, gates, bias=config.bias) if gates else None

    def forward(self, x: Tensor, rope) -> Tensor:
        B, T, _ = x.shape
        H, G, D = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.qkv_proj(x).view(B, T, H + 2 * G, D).transpose(1, 2).split([H, G, G], dim=1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
        y = self.attend(q, k, v)
        if self.gate_proj is not None:  # y times sigmoid(W_g x), per channel or per head
            y = y * torch.sigmoid(self.gate_proj(x)).view(B, T, H, -1).transpose(1, 2)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, H * D))

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        mask = visible(q.shape[2], self.window, self.n_global, q.device)
        if self.sinks is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        scores = (q @ k.transpose(-2, -1)) * self.head_dim**-0.5
        scores = scores.masked_fill(~mask, float("-inf"))
        sink = self.sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        return weights @ v


class MultiTokenAttention(Attention):
    """Multi-token attention (Golovneva et al. 2025), in the order of the released code: zero the
    future, key-query convolution, pre-softmax head mix, softmax with the future at -inf,
    post-softmax convolution, re-zero the future, post-softmax head mix, @ V, then a per-head
    RMSNorm and sigmoid gate."""

    def __init__(self, config: MinitxConfig, layer: int):
        super().__init__(config, layer)
        H, D = self.n_head, self.head_dim

        def att(name, default):
            return config.option("mta", name, default)

        placement = att("conv_placement", "pre") if config.has_mta_conv(layer) else "none"
        c_q, c_k = att("query_kernel", 6), att("key_kernel", 11)
        kernel = lambda: nn.Parameter(torch.zeros(H, 1, c_q, c_k))  # noqa: E731 (values come from the weights)
        mix = lambda g: nn.Parameter(torch.zeros(H // g, g, g))  # noqa: E731 (groups of g heads)
        self.kq_conv = kernel() if placement in ("pre", "both") else None
        self.kq_conv_post = kernel() if placement in ("post", "both") else None
        group = att("head_group", None) or H
        head_mix = att("head_mix", "both")
        pre_group = H if att("pre_mix_all_heads", True) else group
        self.mix_pre = mix(pre_group) if head_mix in ("pre", "both") else None
        self.mix_post = mix(group) if head_mix in ("post", "both") else None
        output_norm = att("output_norm", True)
        self.norm = nn.RMSNorm(D, eps=att("norm_eps", 1e-5)) if output_norm else None
        self.gate = nn.Linear(D, 1) if output_norm else None
        self.float32 = att("float32", True)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        hidden = ~visible(q.shape[2], None, 0, q.device)
        scores = ((q * self.head_dim**-0.5) @ k.transpose(-2, -1)).masked_fill(hidden, 0.0)
        if self.kq_conv is not None:
            scores = convolve(scores, self.kq_conv)
        if self.mix_pre is not None:
            scores = mix_heads(scores, self.mix_pre)
        scores = scores.masked_fill(hidden, float("-inf"))
        low = self.float32 and scores.dtype in (torch.float16, torch.bfloat16)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32 if low else None).to(scores.dtype)
        if self.kq_conv_post is not None:
            weights = convolve(weights, self.kq_conv_post).masked_fill(hidden, 0.0)
        if self.mix_post is not None:
            weights = mix_heads(weights, self.mix_post)
        return self.normalise(weights @ v)

    def normalise(self, out: Tensor) -> Tensor:
        if self.norm is None:
            return out
        if self.float32 and out.dtype in (torch.float16, torch.bfloat16):
            normed = (
                F.rms_norm(out.float(), self.norm.normalized_shape, eps=self.norm.eps).to(out.dtype)
                * self.norm.weight
            )
        else:
            normed = self.norm(out)
        return normed * torch.sigmoid(self.gate(normed))


def convolve(maps: Tensor, kernel: Tensor) -> Tensor:
    """Per-head conv2d over (queries, keys): c_q - 1 zero rows on top (the query axis looks only
    back), the key axis centred."""
    c_q, c_k = kernel.shape[-2:]
    padded = F.pad(maps, (c_k // 2, c_k // 2, c_q - 1, 0))
    return F.conv2d(padded, kernel.to(maps.dtype), groups=kernel.shape[0])


def mix_heads(maps: Tensor, mix: Tensor) -> Tensor:
    """A'_h = sum_h' M[h', h] A_h' within each group of heads; mix is (groups, c_h, c_h)."""
    B, H, T, S = maps.shape
    groups, c_h, _ = mix.shape
    return (mix.to(maps.dtype).transpose(-1, -2) @ maps.reshape(B, groups, c_h, T * S)).view(B, H, T, S)


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet (Yang, Kautz, Hatamizadeh, ICLR 2025); `decay: false` is DeltaNet. Per value
    head a state h (dk x dv), written by the delta rule one token at a time:

        h <- alpha_t h;   u = beta_t (v_t - h^T k_t);   h <- h + k_t u^T;   o_t = h^T q_t / sqrt(dk)

    with q, k, v the SiLU of a causal depthwise convolution over [W_q x | W_k x | W_v x], q and k
    L2-normalised, beta_t = sigmoid(W_b x_t) (times 2 with allow_neg_eigval) and
    alpha_t = exp(-exp(A_log) softplus(W_a x_t + dt_bias)). The output is an RMSNorm of each value
    head times SiLU(W_z x), then W_o. The loop is the definition itself: no positions, no mask."""

    def __init__(self, config: MinitxConfig, layer: int):
        super().__init__()

        def option(name, default):
            return config.option("gdn", name, default)

        head_dim = config.d_model // config.n_head
        self.n_head = config.n_head  # key heads; each serves n_value_head / n_head value heads
        self.key_dim = option("key_head_dim", None) or head_dim
        self.value_dim = option("value_head_dim", None) or head_dim
        self.n_value_head = option("n_value_head", None) or config.n_head
        self.conv_size = option("conv_size", 4)
        self.allow_neg_eigval = option("allow_neg_eigval", False)
        decay = option("decay", True)
        d, keys, values = config.d_model, self.n_head * self.key_dim, self.n_value_head * self.value_dim
        self.q_proj = nn.Linear(d, keys, bias=config.bias)
        self.k_proj = nn.Linear(d, keys, bias=config.bias)
        self.v_proj = nn.Linear(d, values, bias=config.bias)
        self.b_proj = nn.Linear(d, self.n_value_head, bias=config.bias)
        self.a_proj = nn.Linear(d, self.n_value_head, bias=False) if decay else None
        self.g_proj = nn.Linear(d, values, bias=config.bias)
        channels = 2 * keys + values
        self.conv = nn.Conv1d(channels, channels, self.conv_size, groups=channels, bias=False)
        self.A_log = nn.Parameter(torch.zeros(self.n_value_head)) if decay else None
        self.dt_bias = nn.Parameter(torch.zeros(self.n_value_head)) if decay else None
        self.norm = nn.RMSNorm(self.value_dim, eps=1e-6)
        self.out_proj = nn.Linear(values, d, bias=config.bias)

    def forward(self, x: Tensor, rope=None) -> Tensor:
        B, T, _ = x.shape
        mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1).transpose(1, 2)
        mixed = F.conv1d(F.pad(mixed, (self.conv_size - 1, 0)), self.conv.weight, groups=mixed.shape[1])
        keys = self.n_head * self.key_dim
        q, k, v = (
            F.silu(mixed).transpose(1, 2).split([keys, keys, self.n_value_head * self.value_dim], dim=-1)
        )
        r = self.n_value_head // self.n_head
        q, k = (unit(t.reshape(B, T, self.n_head, self.key_dim)) for t in (q, k))
        q, k = q.repeat_interleave(r, dim=2).float(), k.repeat_interleave(r, dim=2).float()
        v = v.reshape(B, T, self.n_value_head, self.value_dim).float()
        beta = torch.sigmoid(self.b_proj(x).float()) * (2 if self.allow_neg_eigval else 1)
        if self.A_log is None:
            alpha = torch.ones_like(beta)
        else:
            alpha = torch.exp(
                -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias.float())
            )
        h = x.new_zeros(B, self.n_value_head, self.key_dim, self.value_dim, dtype=torch.float32)
        outputs = []
        for t in range(T):
            h = h * alpha[:, t, :, None, None]
            u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", h, k[:, t]))
            h = h + k[:, t, :, :, None] * u[:, :, None, :]
            outputs.append(torch.einsum("bhkv,bhk->bhv", h, q[:, t]) * self.key_dim**-0.5)
        # (B, T, value heads, dv), normalised in float32 as minitx does, whatever the weights' dtype
        o = torch.stack(outputs, dim=1).to(x.dtype).float()
        o = F.rms_norm(o, (self.value_dim,), self.norm.weight.float(), self.norm.eps).to(x.dtype)
        z = F.silu(self.g_proj(x)).view(B, T, self.n_value_head, self.value_dim)
        return self.out_proj((o * z).reshape(B, T, -1))


def unit(x: Tensor) -> Tensor:
    """x over its L2 norm along the last axis, eps 1e-6 under the root (minitx's, fla's, Qwen's)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


ATTENTION_CLASSES = {"mta": MultiTokenAttention, "gdn": GatedDeltaNet}  # any other kind: Attention


class Block(nn.Module):
    def __init__(self, config: MinitxConfig, layer: int):
        super().__init__()
        self.norm1 = make_norm(config)
        self.attn = ATTENTION_CLASSES.get(config.layer_kind(layer), Attention)(config, layer)
        self.norm2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, rope) -> Tensor:
        x = x + self.attn(self.norm1(x), rope)
        return x + self.mlp(self.norm2(x))


class MinitxForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = MinitxConfig
    base_model_prefix = "minitx"
    _tied_weights_keys = {"lm_head.weight": "tok_emb.weight"}

    def __init__(self, config: MinitxConfig):
        super().__init__(config)
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = (
            nn.Embedding(config.block_size, config.d_model) if config.positions == "learned" else None
        )
        self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.n_layer))
        self.norm = make_norm(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.tok_emb

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None, **kwargs
    ) -> CausalLMOutputWithPast:
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError(
                "minitx models take no padding: give sequences of equal length without an attention mask"
            )
        T = input_ids.shape[1]
        x = self.tok_emb(input_ids)
        rope = None
        if self.pos_emb is not None:
            if T > self.config.block_size:
                raise ValueError(
                    f"{T} tokens exceed block_size={self.config.block_size} of a model with learned positions"
                )
            x = x + self.pos_emb(torch.arange(T, device=input_ids.device))
        else:
            rope = rope_tables(
                T, self.config.d_model // self.config.n_head, self.config.rope_base, input_ids.device
            )
        for block in self.blocks:
            x = block(x, rope)
        logits = self.lm_head(self.norm(x))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids: Tensor, **kwargs) -> dict:
        return {"input_ids": input_ids}  # no cache: every step sees the whole sequence
