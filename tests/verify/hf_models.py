"""Hugging Face models as users bring them through `python:` (issue 26): CLIP (a 0-dim
`logit_scale`), DINOv2 for image classification (a `mask_token` no classification loss
reaches), Wav2Vec2 with a CTC head (a loss whose lengths are data-dependent). Tiny configs,
no weights; `model(*inputs)` returns the model's own output with `.loss`."""
from __future__ import annotations

import torch


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def build_clip(micro_batch: int = 4):
    from transformers import CLIPConfig, CLIPModel
    cfg = CLIPConfig(text_config=dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                      vocab_size=256, max_position_embeddings=16),
                     vision_config=dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                        num_attention_heads=2, image_size=32, patch_size=8),
                     projection_dim=16)
    model = CLIPModel(cfg)
    g = _gen()
    ids = torch.randint(0, 256, (micro_batch, 16), generator=g)
    pixels = torch.randn(micro_batch, 3, 32, 32, generator=g)

    class Clip(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.clip = model

        def forward(self, input_ids, pixel_values):
            return self.clip(input_ids=input_ids, pixel_values=pixel_values, return_loss=True).loss
    return Clip(), (ids, pixels)


def build_dinov2(micro_batch: int = 4):
    from transformers import Dinov2Config, Dinov2ForImageClassification
    cfg = Dinov2Config(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, mlp_ratio=2, image_size=32,
                       patch_size=8, num_labels=10)
    g = _gen()
    return Dinov2ForImageClassification(cfg), (torch.randn(micro_batch, 3, 32, 32, generator=g),
                                               torch.randint(0, 10, (micro_batch,), generator=g))


class _Labels(torch.nn.Module):
    """`model(x, labels=y)` as `model(x, y)`: the loss through the model's own `labels=`."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, labels):
        return self.model(x, labels=labels).loss


def build_wav2vec2(micro_batch: int = 2, layerdrop: float = 0.0):
    """`layerdrop` > 0: LayerDrop skips random layers each step, so which parameters get a
    gradient changes from step to step ([Note: parameters without a gradient] in runtime/ddp.py)."""
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC
    cfg = Wav2Vec2Config(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                         vocab_size=32, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8),
                         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, mask_time_prob=0.0,
                         layerdrop=layerdrop)
    g = _gen()
    return _Labels(Wav2Vec2ForCTC(cfg)), (torch.randn(micro_batch, 1600, generator=g),
                                          torch.randint(1, 32, (micro_batch, 12), generator=g))


def build_dinov2_labels(micro_batch: int = 4):
    model, (pixels, labels) = build_dinov2(micro_batch)
    return _Labels(model), (pixels, labels)


def build_wav2vec2_layerdrop(micro_batch: int = 2):
    return build_wav2vec2(micro_batch, layerdrop=0.7)


def build_t5(micro_batch: int = 4):
    """T5 trained through `labels=`: its first block of each stack computes the relative
    position bias, which it returns and every later block takes (one storage several layers'
    checkpoints keep). The KV cache off, as `python:` loading sets it (`models.hf.training_defaults`)."""
    from transformers import T5Config, T5ForConditionalGeneration

    from shardsched.models.hf import training_defaults
    cfg = T5Config(vocab_size=320, d_model=64, d_kv=16, d_ff=128, num_layers=4, num_decoder_layers=4, num_heads=4,
                   dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    g = _gen()

    class T5(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.t5 = T5ForConditionalGeneration(cfg)

        def forward(self, input_ids, labels):
            return self.t5(input_ids=input_ids, labels=labels).loss
    model = T5()
    training_defaults(model)
    return model, (torch.randint(0, 320, (micro_batch, 48), generator=g), torch.randint(0, 320, (micro_batch, 32), generator=g))
