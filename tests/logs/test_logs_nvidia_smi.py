"""nvidia-smi: table (incl. driver 610 headers), --query-gpu CSV, -q, -L and topo -m (exact values)."""

from __future__ import annotations

import math

from spectrial.logs import parse

TABLE_610 = """\
Fri Nov 28 10:00:00 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 610.10                 KMD Version: 610.10            CUDA UMD Version: 14.0 |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|=========================================+========================+======================|
|   0  NVIDIA H200                    On  |   00000000:18:00.0 Off |                    0 |
| N/A   29C    P0             75W /  700W |       1MiB / 143771MiB |      0%      Default |
+-----------------------------------------+------------------------+----------------------+
|   1  NVIDIA H200                    On  |   00000000:2A:00.0 Off |                    0 |
| N/A   31C    P0            120W /  700W |   81234MiB / 143771MiB |     97%      Default |
+-----------------------------------------+------------------------+----------------------+
"""


def nan(v: object) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def test_driver_610_kmd_header() -> None:
    df = parse(TABLE_610)
    assert list(df["kind"]) == ["gpu", "gpu"]
    g = df.iloc[1]
    assert (g["driver_version"], g["cuda_version"], g["timestamp"], g["index"], g["name"]) == (
        "610.10", "14.0", "Fri Nov 28 10:00:00 2026", 1, "NVIDIA H200")
    assert (g["memory_used_mib"], g["memory_total_mib"], g["util_pct"], g["temp_c"], g["power_w"], g["pstate"]) == (
        81234, 143771, 97, 31, 120, 'P0')
    assert (g["power_cap_w"], g["bus_id"], g["line"]) == (700, "00000000:2A:00.0", 11) and nan(g["fan_pct"])


def test_csv_with_header_units_and_not_available() -> None:
    df = parse("index, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], power.draw [W], pstate\n"
               "0, NVIDIA H200, 10 MiB, 143771 MiB, 3 %, 75.50 W, P0\n"
               "1, NVIDIA H200, [N/A], 143771 MiB, [N/A], [Not Supported], P8\n")
    assert df[["index", "memory_used_mib", "util_pct", "power_w", "pstate"]].iloc[0].tolist() == [0, 10, 3, 75.5, "P0"]
    assert nan(df.loc[1, "memory_used_mib"]) and nan(df.loc[1, "power_w"]) and df.loc[1, "pstate"] == "P8"


def test_csv_after_echoed_command_and_headerless_portable_query() -> None:
    df = parse("$ nvidia-smi --query-gpu=gpu_name,memory.free --format=csv,noheader,nounits\n"
               "> NVIDIA GeForce GTX 1050 Ti, 2131\n"
               "0, NVIDIA H200, GPU-1111-2222, 1, 143771, 1980, 1980, 5, 16, 575.57.08, 29, 75.09\n")
    assert df["name"].tolist() == ["NVIDIA GeForce GTX 1050 Ti", "NVIDIA H200"]
    assert df.loc[0, "memory_free_mib"] == 2131
    p = df.iloc[1]
    assert (p["uuid"], p["memory_used_mib"], p["sm_clock_mhz"], p["sm_clock_max_mhz"], p["pcie_gen"]) == (
        "GPU-1111-2222", 1, 1980, 1980, 5)
    assert (p["pcie_width"], p["driver_version"], p["temp_c"], p["power_w"]) == (16, "575.57.08", 29, 75.09)


def test_query_q_and_list() -> None:
    df = parse("""\
GPU 0: NVIDIA H200 (UUID: GPU-aaaa-bbbb)
==============NVSMI LOG==============

Timestamp                                 : Sat Nov 29 13:00:00 2026
KMD Version                               : 610.10
CUDA UMD Version                          : 14.0

Attached GPUs                             : 1
GPU 00000000:18:00.0
    Product Name                          : NVIDIA H200
    Persistence Mode                      : Enabled
    Performance State                     : P0
    FB Memory Usage
        Total                             : 143771 MiB
        Used                              : 12 MiB
    BAR1 Memory Usage
        Total                             : 262144 MiB
        Used                              : 1 MiB
    Utilization
        Gpu                               : 7 %
    Temperature
        GPU Current Temp                  : 29 C
    GPU Power Readings
        Instantaneous Power Draw          : 76.00 W
        Current Power Limit               : 700.00 W
""")
    assert list(df["kind"]) == ["gpu", "gpu"]
    assert (df.loc[0, "index"], df.loc[0, "name"], df.loc[0, "uuid"]) == (0, "NVIDIA H200", "GPU-aaaa-bbbb")
    q = df.iloc[1]
    assert (q["driver_version"], q["cuda_version"], q["timestamp"], q["bus_id"]) == (
        "610.10", "14.0", "Sat Nov 29 13:00:00 2026", "00000000:18:00.0")
    assert (q["memory_used_mib"], q["memory_total_mib"], q["util_pct"], q["temp_c"], q["power_w"]) == (
        12, 143771, 7, 29, 76.0)  # FB memory, not BAR1
    assert (q["power_cap_w"], q["pstate"], q["persistence"]) == (700.0, "P0", "Enabled")


def test_topology_tab_separated_with_nic() -> None:
    df = parse("\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
               "GPU0\t X \tNV18\tSYS\t0-47\t0\t\tN/A\nGPU1\tNV18\t X \tPIX\t0-47\t0\t\tN/A\nNIC0\tSYS\tPIX\t X \n\n"
               "Legend:\n")
    assert df[["src", "dst", "link"]].values.tolist() == [
        ["GPU0", "GPU1", "NV18"], ["GPU0", "NIC0", "SYS"], ["GPU1", "GPU0", "NV18"], ["GPU1", "NIC0", "PIX"],
        ["NIC0", "GPU0", "SYS"], ["NIC0", "GPU1", "PIX"]]
    assert df.loc[0, "cpu_affinity"] == "0-47" and df.loc[0, "numa_affinity"] == "0" and df.loc[4, "cpu_affinity"] is None
