"""Tests for mpisparse.models.shapes (plain pytest, no MPI)."""

import math

import pytest

from mpisparse.models import shapes
from mpisparse.models.shapes import MODELS, layer_shapes, model_names, num_params

EXPECTED_TOTALS = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "vgg16": 138_357_544,
    # encoder 33278*650 + 2 LSTM layers * (2*2600*650 + 2*2600)
    # + decoder 650*33278 + 33278
    "lstm-wt2": 21_630_700 + 6_770_400 + 21_663_978,
    "bert-base": 109_482_240,
    # wte 50257*768 + wpe 1024*768 + 12 blocks * (12*768^2 + 13*768) + ln_f 2*768 (the head is tied to wte)
    "gpt2-small": 124_439_808,
    # embeddings (6040+3706)*(8+32) + MLP (2080+528+136) + predict 17
    "ncf": 389_840 + 2_744 + 17,
}


def test_registry_names():
    assert model_names() == sorted(EXPECTED_TOTALS)
    assert set(MODELS) == set(EXPECTED_TOTALS)


@pytest.mark.parametrize("name", sorted(EXPECTED_TOTALS))
def test_totals(name):
    assert num_params(name) == EXPECTED_TOTALS[name]


def test_hand_computed_totals():
    assert EXPECTED_TOTALS["lstm-wt2"] == 50_065_078
    assert EXPECTED_TOTALS["ncf"] == 392_601


@pytest.mark.parametrize("name", sorted(EXPECTED_TOTALS))
def test_names_unique_and_dims_positive(name):
    layers = layer_shapes(name)
    assert layers
    names = [n for n, _ in layers]
    assert len(names) == len(set(names))
    for pname, shape in layers:
        assert isinstance(pname, str) and pname
        assert isinstance(shape, tuple) and shape
        for d in shape:
            assert type(d) is int and d > 0, (pname, shape)


@pytest.mark.parametrize("name", sorted(EXPECTED_TOTALS))
def test_builders_return_fresh_lists(name):
    a = layer_shapes(name)
    a.clear()
    assert layer_shapes(name)


def test_unknown_name():
    with pytest.raises(ValueError) as exc:
        layer_shapes("resnet101")
    assert str(exc.value) == (
        "unknown model 'resnet101'; choose one of: "
        "bert-base, gpt2-small, lstm-wt2, ncf, resnet18, resnet50, vgg16"
    )
    with pytest.raises(ValueError, match="unknown model"):
        num_params("nope")


def _as_dict(name):
    return dict(layer_shapes(name))


def test_resnet50_spot_checks():
    d = _as_dict("resnet50")
    assert layer_shapes("resnet50")[0] == ("conv1.weight", (64, 3, 7, 7))
    assert layer_shapes("resnet50")[-1] == ("fc.bias", (1000,))
    assert d["layer4.2.conv3.weight"] == (2048, 512, 1, 1)
    assert d["fc.weight"] == (1000, 2048)
    assert d["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert d["layer3.5.bn2.bias"] == (256,)
    assert "layer1.1.downsample.0.weight" not in d
    assert len(d) == 161


def test_resnet18_spot_checks():
    d = _as_dict("resnet18")
    assert d["bn1.weight"] == (64,)
    assert d["layer1.0.conv1.weight"] == (64, 64, 3, 3)
    assert "layer1.0.downsample.0.weight" not in d
    assert d["layer2.0.downsample.0.weight"] == (128, 64, 1, 1)
    assert d["layer4.1.conv2.weight"] == (512, 512, 3, 3)
    assert d["fc.weight"] == (1000, 512)
    assert not any("running" in n for n in d)
    assert len(d) == 62


def test_vgg16_spot_checks():
    d = _as_dict("vgg16")
    assert d["features.0.weight"] == (64, 3, 3, 3)
    assert d["features.28.weight"] == (512, 512, 3, 3)
    assert d["classifier.0.weight"] == (4096, 25088)
    assert d["classifier.6.bias"] == (1000,)
    assert sum(1 for n in d if n.startswith("features.") and n.endswith("weight")) == 13


def test_lstm_spot_checks():
    assert [n for n, _ in layer_shapes("lstm-wt2")] == [
        "encoder.weight",
        "rnn.weight_ih_l0", "rnn.weight_hh_l0", "rnn.bias_ih_l0", "rnn.bias_hh_l0",
        "rnn.weight_ih_l1", "rnn.weight_hh_l1", "rnn.bias_ih_l1", "rnn.bias_hh_l1",
        "decoder.weight", "decoder.bias",
    ]
    d = _as_dict("lstm-wt2")
    assert d["encoder.weight"] == (33278, 650)
    assert d["rnn.weight_ih_l1"] == (2600, 650)
    assert d["decoder.weight"] == (33278, 650)


def test_bert_spot_checks():
    d = _as_dict("bert-base")
    assert d["embeddings.word_embeddings.weight"] == (30522, 768)
    assert d["embeddings.position_embeddings.weight"] == (512, 768)
    assert d["embeddings.token_type_embeddings.weight"] == (2, 768)
    assert d["encoder.layer.11.attention.self.query.weight"] == (768, 768)
    assert d["encoder.layer.0.intermediate.dense.weight"] == (3072, 768)
    assert d["encoder.layer.0.output.dense.weight"] == (768, 3072)
    assert d["encoder.layer.5.output.LayerNorm.bias"] == (768,)
    assert layer_shapes("bert-base")[-1] == ("pooler.dense.bias", (768,))
    assert "encoder.layer.12.attention.self.query.weight" not in d


def test_ncf_spot_checks():
    d = _as_dict("ncf")
    assert d["mf_user_embed.weight"] == (6040, 8)
    assert d["mf_item_embed.weight"] == (3706, 8)
    assert d["mlp_user_embed.weight"] == (6040, 32)
    assert d["mlp_item_embed.weight"] == (3706, 32)
    assert [d[f"mlp.{i}.weight"] for i in range(3)] == [(32, 64), (16, 32), (8, 16)]
    assert d["final.weight"] == (1, 16)
    assert d["final.bias"] == (1,)


# ---------------------------------------------------------------------------
# Optional cross-check against modules built by hand in torch (test only).
# ---------------------------------------------------------------------------

def _torch_resnet(torch, bottleneck, depths):
    nn = torch.nn
    expansion = 4 if bottleneck else 1

    class Block(nn.Module):
        def __init__(self, c_in, planes, stride):
            super().__init__()
            out = planes * expansion
            if bottleneck:
                self.conv1 = nn.Conv2d(c_in, planes, 1, bias=False)
                self.bn1 = nn.BatchNorm2d(planes)
                self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
                self.bn2 = nn.BatchNorm2d(planes)
                self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
                self.bn3 = nn.BatchNorm2d(out)
            else:
                self.conv1 = nn.Conv2d(c_in, planes, 3, stride, 1, bias=False)
                self.bn1 = nn.BatchNorm2d(planes)
                self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
                self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = None
            if stride != 1 or c_in != out:
                self.downsample = nn.Sequential(
                    nn.Conv2d(c_in, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            c_in = 64
            for stage, (planes, depth) in enumerate(zip((64, 128, 256, 512), depths), 1):
                blocks = []
                for i in range(depth):
                    stride = 2 if (i == 0 and stage > 1) else 1
                    blocks.append(Block(c_in, planes, stride))
                    c_in = planes * expansion
                setattr(self, f"layer{stage}", nn.Sequential(*blocks))
            self.fc = nn.Linear(c_in, 1000)

    return Net()


def _torch_named_shapes(module):
    return [(n, tuple(p.shape)) for n, p in module.named_parameters()]


@pytest.mark.parametrize("name,bottleneck,depths", [
    ("resnet18", False, (2, 2, 2, 2)),
    ("resnet50", True, (3, 4, 6, 3)),
])
def test_resnet_matches_torch(name, bottleneck, depths):
    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        net = _torch_resnet(torch, bottleneck, depths)
    assert _torch_named_shapes(net) == layer_shapes(name)


def test_lstm_matches_torch():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class RNNModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Embedding(33278, 650)
            self.rnn = nn.LSTM(650, 650, 2)
            self.decoder = nn.Linear(650, 33278)

    with torch.device("meta"):
        net = RNNModel()
    assert _torch_named_shapes(net) == layer_shapes("lstm-wt2")


def test_sizes_are_consistent_with_prod():
    for name in model_names():
        total = sum(math.prod(s) for _, s in shapes.MODELS[name]())
        assert total == num_params(name)
