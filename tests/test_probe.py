"""probe: counts against a hand computation, λ per variant, pairwise overlap, outputs."""

import json
import math

import pytest
import torch

from ram_live import ConfigError, probe, merge
from tests.conftest import make_agents


def test_probe_hand_case():
    base = {"a": torch.zeros(4), "b": torch.zeros(2)}
    x = {"a": torch.tensor([1.0, 1.0, 0.0, 0.0]), "b": torch.tensor([1.0, 0.0])}
    y = {"a": torch.tensor([1.0, 0.0, 1.0, 0.0]), "b": torch.tensor([0.0, 0.0])}
    report = probe({"x": x, "y": y}, base=base)
    sx, sy = report.agents["x"], report.agents["y"]
    assert (sx.total, sx.active, sx.unique, sx.shared) == (6, 3, 2, 1)
    assert (sy.active, sy.unique) == (2, 1)
    assert sx.rho == 0.5 and sy.rho == 1.0
    assert sx.lambdas == {"ram": 1.0, "ram_plus": pytest.approx(1.05), "ram_plus_soft": pytest.approx(1 + 0.1 / 3)}
    assert report.histogram == [2, 3, 1]
    assert report.jaccard[0][1] == pytest.approx(1 / 4)
    px, py = 3 / 6, 2 / 6
    assert report.expected_jaccard[0][1] == pytest.approx(px * py / (px + py - px * py))
    assert report.cosine[0][1] == pytest.approx(1 / math.sqrt(3 * 2))
    assert report.tensors["b"]["y"].active == 0 and report.tensors["b"]["x"].rho == 0.0


def test_probe_agrees_with_the_merge(base_sd):
    agents = make_agents(base_sd, [0.03, 0.46, 0.54])
    report = probe(agents, base=base_sd)
    _, info = merge(agents, base=base_sd, return_info=True)
    for name in info.agents:
        assert report.agents[name].lambdas["ram_plus"] == pytest.approx(info.lambdas[name])
        assert report.agents[name].active == int(info.statistics.active[list(info.agents).index(name)])
    densities = [report.agents[n].density for n in info.agents]
    assert densities == pytest.approx([0.03, 0.46, 0.54], abs=0.03)


def test_report_outputs(tmp_path, base_sd):
    agents = make_agents(base_sd, [0.0, 0.5])  # agent_0 changed nothing
    report = probe(agents, base=base_sd)
    text = report.table()
    assert "agent_0" in text and "c=2" in text
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert set(data["layers"]) == {"embed", "layers.0", "layers.1", "head"}
    assert data["agents"]["agent_1"]["rho"] == 0.0
    pytest.importorskip("matplotlib")
    path = report.plot(str(tmp_path / "probe.png"))
    assert (tmp_path / "probe.png").stat().st_size > 1000 and path.endswith("probe.png")


def test_rho_inf_is_json_string():
    base = {"w": torch.zeros(3)}
    a = {"w": torch.tensor([1.0, 0.0, 0.0])}
    data = probe([a, a], base=base).to_dict()
    assert data["agents"]["agent_0"]["rho"] == "inf"


@pytest.mark.parametrize(
    "options, name",
    [
        ({"eps": float("nan")}, "eps"),
        ({"eps": -1}, "eps"),
        ({"eps": float("inf")}, "eps"),
        ({"r": -1}, "r"),
        ({"r": float("inf")}, "r"),
        ({"r": 1e39}, "r"),
        ({"alpha": float("nan")}, "alpha"),
        ({"alpha": -0.5}, "alpha"),
        ({"activity": "exact"}, "activity"),
    ],
)
def test_probe_validates_its_options_as_the_merge(options, name):
    base = {"w": torch.zeros(4, 4)}
    agents = [{"w": torch.ones(4, 4)}, {"w": 2 * torch.ones(4, 4)}]
    with pytest.raises(ConfigError, match=rf"^{name} must be") as probed:
        probe(agents, base=base, **options)
    with pytest.raises(ConfigError, match=rf"{name} must be") as merged:
        merge(agents, base=base, **options)
    assert str(merged.value).endswith(str(probed.value))
