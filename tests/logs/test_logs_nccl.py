"""NCCL debug output: env, init, channels, connections, tuning (exact values)."""

from __future__ import annotations

import math

from spectrial.logs import parse


def nan(v: object) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def test_env_lines_value_without_trailing_period_and_rank_tag() -> None:
    df = parse("""\
vm:892:892 [0] NCCL INFO NCCL_PROTO set by environment to LL.
vm:892:893 [1] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0.1
[3] NCCL INFO NCCL_DEBUG_SUBSYS set by environment to INIT,ENV,TUNING.
""")
    assert list(df["kind"]) == ["env"] * 3
    assert list(df["variable"]) == ["NCCL_PROTO", "NCCL_SOCKET_IFNAME", "NCCL_DEBUG_SUBSYS"]
    assert list(df["value"]) == ["LL", "eth0.1", "INIT,ENV,TUNING"]
    assert list(df["rank"]) == [0, 1, 3]
    assert (df.loc[0, "host"], df.loc[0, "pid"]) == ("vm", 892) and df.loc[2, "host"] is None


def test_init_channels_and_version() -> None:
    df = parse("""\
NCCL version 2.28.9+cuda12.9
vm:892:892 [0] NCCL INFO comm 0x21b71640 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0
vm:892:892 [0] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer
vm:892:892 [0] NCCL INFO Broadcast: opCount a sendbuff 0x7f recvbuff 0x7f count 24 datatype 0 op 0 root 0 comm 0x55 [nranks=1024] stream 0x55
""")
    assert list(df["kind"]) == ["version", "init", "channels"]
    assert df.loc[0, "version"] == "2.28.9+cuda12.9"
    i = df.iloc[1]
    assert (i["comm"], i["rank"], i["nranks"], i["nnodes"], i["local_ranks"], i["local_rank"]) == (
        "0x21b71640", 0, 2, 1, 2, 0)
    c = df.iloc[2]
    assert (c["coll_channels"], c["collnet_channels"], c["nvls_channels"], c["p2p_channels"]) == (24, 24, 0, 32)
    assert c["p2p_channels_per_peer"] == 32
    assert df.attrs["unparsed_lines"] == 1  # the collective call line is not an init record


def test_connections_of_both_eras() -> None:
    df = parse("""\
kolyoz2:25148:25826 [3] NCCL INFO Channel 03/0 : 7[3] -> 5[1] via P2P/CUMEM
ip-1:45328:45333 [0] NCCL INFO Ring 00 : 35 -> 34 [send] via NET/Socket/0
host:1:2 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/direct pointer
""")
    assert df["channel"].tolist() == [3, 0, 1]
    assert df["src"].tolist() == [7, 35, 1] and df["dst"].tolist() == [5, 34, 0]
    assert df["transport"].tolist() == ["P2P/CUMEM", "NET/Socket/0", "P2P/direct pointer"]
    assert df.loc[1, "direction"] == "send" and df.loc[0, "direction"] is None


def test_tuning_per_call_ids_and_names() -> None:
    df = parse("""\
[0] h100:497888:497888 [0] NCCL INFO 8589934592 Bytes -> Algo 1 proto 2 time 86069.968750
host:1:1 [0] NCCL INFO AllReduce: 16384 Bytes -> Algo TREE proto LL channel{Lo..Hi}={0..3}
""")
    assert df["algorithm"].tolist() == ["Ring", "Tree"] and df["protocol"].tolist() == ["Simple", "LL"]
    assert df.loc[0, "time_us"] == 86069.96875 and nan(df.loc[1, "time_us"])
    assert df.loc[1, "collective"] == "AllReduce" and df.loc[1, "bytes"] == 16384


def test_tuning_tables_both_eras() -> None:
    new = parse("""\
[0] NCCL INFO   Algorithm   |                  Tree                  |                  Ring                  |
[0] NCCL INFO   Protocol    |       LL |    LL128 |   Simple |       LL |    LL128 |   Simple |
[0] NCCL INFO  Max NThreads |      512 |      640 |      512 |      512 |      640 |      256 |
[0] NCCL INFO     AllReduce |  6.8/ 1.2 | 11.6/ 2.3 | 24.0/ 9.4 |  4.4/ 3.0 |  8.5/ 6.1 | 21.0/18.5 |
""")
    assert len(new) == 6 and (new["kind"] == "tuning").all()
    last = new.iloc[5]
    assert (last["collective"], last["algorithm"], last["protocol"], last["latency_us"], last["bw_gbs"]) == (
        "AllReduce", "Ring", "Simple", 21.0, 18.5)
    assert last["nthreads"] == 256 and new.iloc[0]["line"] == 4
    old = parse("n1:1802:1851 [0] NCCL INFO Latency/AlgBw |    Tree/    LL |    Ring/Simple |\n"
                "n1:1802:1851 [0] NCCL INFO     Broadcast |     0.0/   0.0 |    18.0/   9.0 |\n")
    assert old[["algorithm", "protocol", "latency_us", "bw_gbs"]].values.tolist() == [
        ["Tree", "LL", 0.0, 0.0], ["Ring", "Simple", 18.0, 9.0]]


DESTROY = """\
host:5:5 [0] NCCL INFO comm 0x55d0e3c0 rank 0 nranks 2 cudaDev 0 busId 60 - Init COMPLETE
host:5:5 [1] NCCL INFO comm 0x55d0e4f0 rank 1 nranks 2 cudaDev 1 busId 70 - Init COMPLETE
host:5:5 [0] NCCL INFO comm 0x55d0e3c0 rank 0 nranks 2 cudaDev 0 busId 60 - Destroy COMPLETE
host:5:5 [1] NCCL INFO comm 0x55d0e4f0 rank 1 nranks 2 cudaDev 1 busId 70 - Abort COMPLETE
"""


def test_destroy_complete_is_a_destroy_record_not_a_second_init() -> None:
    df = parse(DESTROY)
    assert list(df["kind"]) == ["init", "init", "destroy", "destroy"]
    assert df["state"].tolist() == ["Init COMPLETE", "Init COMPLETE", "Destroy COMPLETE", "Abort COMPLETE"]
    assert df[df["kind"] == "init"]["comm"].nunique() == 2  # two communicators, not four
    assert df.loc[2, "comm"] == "0x55d0e3c0" and df.loc[3, "cuda_dev"] == 1
    only = parse(DESTROY, kinds="destroy")
    assert only["line"].tolist() == [3, 4] and set(only["kind"]) == {"destroy"}
