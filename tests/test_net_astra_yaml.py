"""ASTRA-sim network files read without PyYAML (start-up of small replays, issue 30 item 4): the fast reader
gives yaml.safe_load's mapping, value types included, or declines and PyYAML reads the file."""

import random
import sys
from pathlib import Path

import pytest
import yaml
from xsim.netmodels.astra import _simple_flow_yaml, load_network_yml

CONFIGS = Path(__file__).resolve().parents[1].parent / "shared" / "peer_configs"


def _same(text: str) -> bool:
    """True when the fast reader took the text; asserts it read what PyYAML reads."""
    doc = _simple_flow_yaml(text)
    if doc is None:
        return False
    assert repr(doc) == repr(yaml.safe_load(text)), text
    return True


def test_reference_network_files_are_read_as_pyyaml_reads_them():
    files = sorted(CONFIGS.rglob("*.yml"))
    if not files:
        pytest.skip(f"no ASTRA-sim configs in {CONFIGS}")
    assert all(_same(f.read_text()) for f in files)


def test_the_usual_shape_with_comments_and_types():
    text = "# net\ntopology: [ Switch, Ring ]  # dims\nnpus_count: [8,4]\n\nbandwidth: [ 400, 3.125 ]\nlatency: [936.25, 0]\n"
    assert _simple_flow_yaml(text) == {
        "topology": ["Switch", "Ring"],
        "npus_count": [8, 4],
        "bandwidth": [400, 3.125],
        "latency": [936.25, 0],
    }
    assert type(_simple_flow_yaml(text)["bandwidth"][0]) is int  # 400 is an int to PyYAML too


@pytest.mark.parametrize(
    "text",
    [
        "topology: [ yes ]",  # a YAML 1.1 boolean
        "on: [ 1 ]",  # a boolean key
        "latency: [ 010 ]",  # octal to YAML 1.1
        "latency: [ 1e3 ]",  # a string to PyYAML (no dot)
        "latency: [ 5. ]",
        "latency: [ 1_000 ]",
        "latency: [ -5 ]",
        "  topology: [ Ring ]",  # indented
        "topology: [ Ring ]\r\n",
        "topology:\n  - Ring",  # block style
        "topology: Ring",  # not a list
        "",
        "# only a comment",
    ],
)
def test_other_text_goes_to_pyyaml(text):
    assert _simple_flow_yaml(text) is None


def test_random_flow_files_read_as_pyyaml_reads_them():
    rng = random.Random(30)
    items = ["Ring", "Switch", "50", "50.0", "0", "00.5", "3.125", "e", "y", "True", "1e3", "Null", "12:30"]
    keys = ["topology", "npus_count", "bandwidth", "latency", "_k9", "On", "null"]
    taken = 0
    for _ in range(3000):
        lines = []
        for _ in range(rng.randint(1, 4)):
            sep = rng.choice(["", " "]) + "," + rng.choice(["", " "])
            its = sep.join(rng.choice(items) for _ in range(rng.randint(0, 3)))
            tail = rng.choice(["", " # c", "#c", " "])
            lines.append(rng.choice(keys) + ":" + rng.choice([" ", ""]) + "[ " + its + "]" + tail)
        taken += _same("\n".join(lines) + "\n")
    assert taken > 100  # the check above ran on many accepted files (169 of 3000 with this seed)


def test_a_replay_of_the_usual_file_does_not_import_pyyaml(tmp_path):
    net = tmp_path / "n.yml"
    net.write_text("topology: [ Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50 ]\nlatency: [ 500 ]\n")
    import subprocess

    code = (
        "import sys; from xsim.netmodels.astra import load_network_yml; "
        f"n = load_network_yml({str(net)!r}); print(n.dims[0].npus, 'yaml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["8", "False"]
    assert load_network_yml(net).dims[0].bandwidth_gbps == 50.0
