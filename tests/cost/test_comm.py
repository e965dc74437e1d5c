"""Alpha-beta collective times against their closed forms."""
import pytest

from shardsched.cost.bytes import parse_bytes
from shardsched.cost.comm import Collective, block_size_bytes, collective_seconds
from shardsched.cost.device import DeviceSpec, Cluster, Link
from shardsched.errors import UsageError


def cluster(world, gpn, *, a_in=1e-5, bw_in=1e11, a_out=5e-5, bw_out=1e10):
    dev = DeviceSpec(name="t", peak_flops=1e12, mfu=1.0, memory_bytes=1 << 30,
                     intra=Link(alpha_seconds=a_in, bandwidth=bw_in), inter=Link(alpha_seconds=a_out, bandwidth=bw_out))
    return Cluster(world=world, gpus_per_node=gpn, device=dev)


def test_ring_single_node():
    c, m = cluster(8, 8), 1e9
    ag = 7 * 1e-5 + 7 / 8 * m / 1e11
    assert collective_seconds(Collective.ALL_GATHER, m, c) == pytest.approx(ag, rel=1e-12)
    assert collective_seconds(Collective.REDUCE_SCATTER, m, c) == pytest.approx(ag, rel=1e-12)
    assert collective_seconds(Collective.ALL_REDUCE, m, c) == pytest.approx(2 * ag, rel=1e-12)


def test_across_nodes():
    c, m = cluster(32, 8), 8e8
    # AllGather / ReduceScatter: one flat ring of 32 workers, each of its 31 steps paced by
    # the inter-node hop; the bytes of the two-level bound (each NIC carries m/8 across nodes).
    flat = 31 * 5e-5 + 3 / 4 * (m / 8) / 1e10 + 7 / 8 * m / 1e11
    assert collective_seconds(Collective.ALL_GATHER, m, c) == pytest.approx(flat, rel=1e-12)
    assert collective_seconds(Collective.REDUCE_SCATTER, m, c) == pytest.approx(flat, rel=1e-12)
    # AllReduce: two levels, an inter-node ring over 4 nodes carrying m/8, an intra-node ring.
    inter = 3 * 5e-5 + 3 / 4 * (m / 8) / 1e10
    intra = 7 * 1e-5 + 7 / 8 * m / 1e11
    assert collective_seconds(Collective.ALL_REDUCE, m, c) == pytest.approx(2 * (inter + intra), rel=1e-12)


def test_world_one_is_free():
    assert collective_seconds(Collective.ALL_REDUCE, 1e9, cluster(1, 8)) == 0.0


@pytest.mark.parametrize("world,gpn", [(8, 8), (64, 8), (1024, 8), (2, 2)])
def test_block_size_reaches_90_percent_of_bandwidth(world, gpn):
    c = cluster(world, gpn)
    b = block_size_bytes(c)
    big = 1e15
    asymptote = big / collective_seconds(Collective.ALL_GATHER, big, c)
    eff = lambda m: m / collective_seconds(Collective.ALL_GATHER, m, c) / asymptote  # noqa: E731
    assert eff(b * 1.001) >= 0.9 > eff(b * 0.9)


@pytest.mark.parametrize("text,expected", [("2GiB", 2 << 30), ("512MiB", 512 << 20), ("1.5GB", 1_500_000_000),
                                           ("4096", 4096), ("40 GiB", 40 << 30)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["3XB", "GiB", "-1GiB", "0", "two"])
def test_parse_bytes_rejects(text):
    with pytest.raises(UsageError, match="accepted"):
        parse_bytes(text)


def test_a_collective_with_its_own_fitted_link_is_priced_on_it():
    """gloo's ReduceScatter is an AllReduce plus a copy: `shardsched profile` fits it apart."""
    import dataclasses
    c = cluster(32, 8)
    slow = Link(alpha_seconds=4e-5, bandwidth=2e10)
    c2 = dataclasses.replace(c, device=dataclasses.replace(c.device, collectives={"reduce_scatter": slow}))
    m = 8e8
    assert collective_seconds(Collective.REDUCE_SCATTER, m, c2) == pytest.approx(
        31 * 5e-5 + 3 / 4 * (m / 8) / 1e10 + 7 / 8 * m / 2e10, rel=1e-12)
    # Collectives without their own fit keep the node's link.
    for k in (Collective.ALL_GATHER, Collective.ALL_REDUCE):
        assert collective_seconds(k, m, c2) == collective_seconds(k, m, c)
