"""Small transformers architectures (CNNs, ViT, BERT, GPT-2, Swin, T5 encoder, DETR) from tiny configs with random
weights, each with one input set: the opset matrix and the .pt2 capture tests. Nothing is downloaded."""
from __future__ import annotations

import torch


def img(batch=1, size=32):
    return {"pixel_values": torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))}
def _bn_stats(model):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 1.5)
    return model.eval()
def resnet(layer_type="basic"):
    from transformers import ResNetConfig, ResNetForImageClassification
    torch.manual_seed(0)
    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type=layer_type, num_labels=4)
    return _bn_stats(ResNetForImageClassification(cfg)), img()
def convnext():
    from transformers import ConvNextConfig, ConvNextForImageClassification
    torch.manual_seed(0)
    cfg = ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=4)
    return ConvNextForImageClassification(cfg).eval(), img()
def efficientnet():
    from transformers import EfficientNetConfig, EfficientNetForImageClassification
    torch.manual_seed(0)
    cfg = EfficientNetConfig(image_size=32, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320,
                             num_labels=4)
    return _bn_stats(EfficientNetForImageClassification(cfg)), img()
def mobilenet():
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    torch.manual_seed(0)
    cfg = MobileNetV2Config(image_size=32, depth_multiplier=0.25, num_labels=4)
    return _bn_stats(MobileNetV2ForImageClassification(cfg)), img()
def vit():
    from transformers import ViTConfig, ViTForImageClassification
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=37, num_labels=3)
    return ViTForImageClassification(cfg).eval(), img()
def bert():
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                     max_position_embeddings=64)
    m = BertModel(cfg).eval()
    return m, {"input_ids": torch.randint(0,100,(1,12)), "attention_mask": torch.ones(1,12,dtype=torch.int64)}
def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64, use_cache=False)
    m = GPT2LMHeadModel(cfg).eval()
    return m, {"input_ids": torch.randint(0,100,(1,12))}
def swin():
    from transformers import SwinConfig, SwinModel
    torch.manual_seed(0)
    cfg = SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[1,1], num_heads=[2,2], window_size=4)
    m = SwinModel(cfg).eval()
    return m, img()
def t5enc():
    from transformers import T5Config, T5EncoderModel
    torch.manual_seed(0)
    m = T5EncoderModel(T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=2)).eval()
    return m, {"input_ids": torch.randint(0,100,(1,12))}
def detr():
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig
    torch.manual_seed(0)
    backbone = ResNetConfig(embedding_size=16, hidden_sizes=[16,32,32,32], depths=[1,1,1,1], out_features=["stage4"])
    cfg = DetrConfig(use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone,
                     d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37, num_queries=5, num_labels=3)
    return _bn_stats(DetrForObjectDetection(cfg)), img(size=64)
ARCHS = {"resnet18": resnet, "resnet50": lambda: resnet("bottleneck"), "convnext": convnext,
         "efficientnet": efficientnet, "mobilenet": mobilenet, "vit": vit, "bert": bert, "gpt2": gpt2, "swin": swin,
         "t5enc": t5enc, "detr": detr}
