"""Hand-made fixtures for each rule of metrics.md §1-4 and §8 (timeline analyses).

TraceData is built directly from small tables, so every expected number can be
checked by hand from the intervals written here.
"""
import numpy as np
import pytest

from tb_bottleneck_plugin.trace import model as M
from tb_bottleneck_plugin.analysis.breakdown import step_breakdown, is_comm_kernel_name
from tb_bottleneck_plugin.analysis.gpu import (clipped_kernel_weights, gpu_metrics, idle_breakdown,
                                               sm_efficiency_integral)
from tb_bottleneck_plugin.analysis.input_bound import input_bound, verdict_for
from tb_bottleneck_plugin.analysis.linking import (calls_inside, gpu_ops_pairs, gpu_runtime_index,
                                                   innermost_enclosing)
from tb_bottleneck_plugin.analysis.signals import communication_signal, launch_signal, sync_signal
from tb_bottleneck_plugin.analysis.steps import REASON_NO_GPU, find_steps


def make_trace(cpu=(), runtime=(), gpu=(), annotations=(), first_last=None):
    """cpu: (name, ts, dur[, kind, pid, tid]); runtime: (name, ts, dur, corr[, pid, tid]);
    gpu: (kind, name, ts, dur, corr[, device, stream, blocks_per_sm, occupancy]);
    annotations: (name, ts, dur)."""
    strings, index = [], {}

    def sid(s):
        if s not in index:
            index[s] = len(strings)
            strings.append(s)
        return index[s]

    cpu = [tuple(c) + (M.CPU_OP, 1, 1)[len(c) - 3:] for c in cpu]
    runtime = [tuple(r) + (1, 1)[len(r) - 4:] for r in runtime]
    gpu = [tuple(g) + (0, 7, np.nan, np.nan)[len(g) - 5:] for g in gpu]
    n = len(gpu)
    neg = np.full(n, -1, np.int64)
    gpu_t = M.GpuTable(
        kind=np.array([g[0] for g in gpu], np.int8), name=np.array([sid(g[1]) for g in gpu], np.int32),
        ts=np.array([g[2] for g in gpu], float), dur=np.array([g[3] for g in gpu], float),
        device=np.array([g[5] for g in gpu], np.int32), stream=np.array([g[6] for g in gpu], np.int64),
        correlation=np.array([g[4] for g in gpu], np.int64), external_id=neg.copy(),
        grid_x=neg.copy(), grid_y=neg.copy(), grid_z=neg.copy(), block_x=neg.copy(), block_y=neg.copy(),
        block_z=neg.copy(), registers_per_thread=neg.copy(), shared_memory=neg.copy(),
        blocks_per_sm=np.array([g[7] for g in gpu], float), warps_per_sm=np.full(n, np.nan),
        achieved_occupancy_pct=np.array([g[8] for g in gpu], float),
        occupancy_limit=np.full(n, -1, np.int32), bytes=neg.copy(), msg_nelems=neg.copy(),
        msg_dtype=np.full(n, -1, np.int32))
    cpu_t = M.CpuTable(
        kind=np.array([c[3] for c in cpu], np.int8), category=np.array([sid("cpu_op") for c in cpu], np.int32),
        name=np.array([sid(c[0]) for c in cpu], np.int32), pid=np.array([c[4] for c in cpu], np.int64),
        tid=np.array([c[5] for c in cpu], np.int64), ts=np.array([c[1] for c in cpu], float),
        dur=np.array([c[2] for c in cpu], float), external_id=np.full(len(cpu), -1, np.int64))
    rt_t = M.RuntimeTable(
        name=np.array([sid(r[0]) for r in runtime], np.int32), pid=np.array([r[4] for r in runtime], np.int64),
        tid=np.array([r[5] for r in runtime], np.int64), ts=np.array([r[1] for r in runtime], float),
        dur=np.array([r[2] for r in runtime], float), correlation=np.array([r[3] for r in runtime], np.int64),
        external_id=np.full(len(runtime), -1, np.int64),
        is_driver=np.array([r[0].startswith("cu") and not r[0].startswith("cuda") for r in runtime], bool))
    ann_t = M.GpuAnnotationTable(
        name=np.array([sid(a[0]) for a in annotations], np.int32), ts=np.array([a[1] for a in annotations], float),
        dur=np.array([a[2] for a in annotations], float), device=np.zeros(len(annotations), np.int32),
        stream=np.full(len(annotations), 7, np.int64))
    all_ts = [c[1] for c in cpu] + [r[1] for r in runtime] + [g[2] for g in gpu]
    all_end = [c[1] + c[2] for c in cpu] + [r[1] + r[2] for r in runtime] + [g[2] + g[3] for g in gpu]
    lo, hi = first_last or ((min(all_ts), max(all_end)) if all_ts else (np.nan, np.nan))
    meta = M.TraceMeta(source="fixture", first_ts=lo, last_ts=hi)
    return M.TraceData(meta=meta, strings=strings, gpu=gpu_t, cpu=cpu_t, runtime=rt_t,
                       memory=M.MemoryTable.empty(), gpu_annotations=ann_t)


K, CP, MS = M.GPU_KERNEL, M.GPU_MEMCPY, M.GPU_MEMSET
UA = M.CPU_USER_ANNOTATION


# ---------------------------------------------------------------- linking
def test_linking_nested_ops_and_threads():
    t = make_trace(
        cpu=[("aten::outer", 0, 100), ("aten::inner", 10, 20), ("aten::other_thread", 0, 100, M.CPU_OP, 1, 2)],
        runtime=[("cudaLaunchKernel", 12, 5, 1), ("cudaLaunchKernel", 50, 5, 2),
                 ("cudaLaunchKernel", 95, 10, 3)],  # the last one sticks out of every op
        gpu=[(K, "k1", 200, 10, 1), (K, "k2", 220, 10, 2), (K, "k3", 240, 10, 3), (K, "k4", 260, 10, 99)])
    assert gpu_runtime_index(t).tolist() == [0, 1, 2, -1]
    op, call = calls_inside(t)
    assert sorted(zip(op.tolist(), call.tolist())) == [(0, 0), (0, 1), (1, 0)]
    op, g = gpu_ops_pairs(t)
    assert sorted(zip(op.tolist(), g.tolist())) == [(0, 0), (0, 1), (1, 0)]
    assert innermost_enclosing(t, None, np.array([0, 1, 2])).tolist() == [1, 0, -1]
    # a subset of CPU rows
    op, call = calls_inside(t, np.array([1]))
    assert op.tolist() == [1] and call.tolist() == [0]


# ---------------------------------------------------------------- steps
def _two_step_trace(extra_gpu=(), third=None):
    cpu = [("ProfilerStep#1", 0, 100, UA), ("ProfilerStep#2", 110, 90, UA)]
    runtime = [("cudaLaunchKernel", 10, 5, 1), ("cudaLaunchKernel", 120, 5, 2), ("cudaLaunchKernel", 130, 5, 3)]
    gpu = [(K, "k", 50, 100, 1), (K, "k", 210, 50, 2), (K, "k", 262, 3, 3)] + list(extra_gpu)
    if third:
        cpu.append(("ProfilerStep#3", 300, 50, UA))
        for i, ts in enumerate(third):
            runtime.append(("cudaLaunchKernel", 305 + i, 0.5, 10 + i))
            gpu.append((K, "k", ts, 5, 10 + i))
    return make_trace(cpu=cpu, runtime=runtime, gpu=gpu)


def test_stretching_follows_gpu_work():
    s = find_steps(_two_step_trace())
    assert s.found and s.stretched
    assert s.numbers.tolist() == [1, 2]
    assert s.start.tolist() == [0, 150]  # step 2 starts at max(prev end 150, host start 110)
    assert s.end.tolist() == [150, 265]  # max(host end, end of launched GPU work)
    assert s.gpu_count.tolist() == [1, 2]
    assert s.window == (0, 265)


def test_first_step_starts_after_unlinked_gpu_work():
    # an unlinked kernel (no runtime call) ending at 5, before the first linked kernel (50)
    s = find_steps(_two_step_trace(extra_gpu=[(K, "warmup", -20, 25, 77)]))
    assert s.start[0] == 5
    # an unlinked kernel that ends after the first linked kernel starts does not count
    s = find_steps(_two_step_trace(extra_gpu=[(K, "late", -20, 80, 77)]))
    assert s.start[0] == 0


def test_step_without_gpu_work_ends_at_least_at_its_start():
    t = make_trace(cpu=[("ProfilerStep#1", 0, 100, UA), ("ProfilerStep#2", 110, 20, UA),
                        ("ProfilerStep#3", 140, 20, UA)],
                   runtime=[("cudaLaunchKernel", 10, 5, 1), ("cudaLaunchKernel", 145, 5, 2)],
                   gpu=[(K, "k", 50, 100, 1), (K, "k", 150, 5, 2)])
    s = find_steps(t)
    # step 2 launched nothing: start = max(150, 110) = 150, end = max(130, 150) = 150
    assert (s.start[1], s.end[1]) == (150, 150)
    assert s.included.tolist() == [True, True, True]


def test_trailing_step_without_gpu_work_is_excluded():
    t = _two_step_trace()
    t2 = make_trace(cpu=[("ProfilerStep#1", 0, 100, UA), ("ProfilerStep#2", 110, 90, UA),
                         ("ProfilerStep#3", 300, 50, UA)],
                    runtime=[("cudaLaunchKernel", 10, 5, 1), ("cudaLaunchKernel", 120, 5, 2)],
                    gpu=[(K, "k", 50, 100, 1), (K, "k", 210, 50, 2)])
    s = find_steps(t2)
    assert s.inc_numbers.tolist() == [1, 2]
    assert s.excluded == [{"number": 3, "reason": REASON_NO_GPU}]
    assert find_steps(t).excluded == []


def test_cut_off_last_step_is_excluded():
    # step 3 launched 1 GPU activity, step 2 launched 2: 1 < 0.8 * 2
    s = find_steps(_two_step_trace(third=[400]))
    assert s.inc_numbers.tolist() == [1, 2]
    assert [e["number"] for e in s.excluded] == [3]
    assert "80%" in s.excluded[0]["reason"]
    # 2 activities: not fewer than 80 % of 2, kept
    s = find_steps(_two_step_trace(third=[400, 410]))
    assert s.inc_numbers.tolist() == [1, 2, 3] and s.excluded == []


def test_cpu_only_trace_excludes_nothing_and_gpu_annotation_is_not_a_step():
    t = make_trace(cpu=[("ProfilerStep#1", 0, 100, UA), ("ProfilerStep#2", 100, 100, UA),
                        ("aten::mm", 10, 20)],
                   annotations=[("ProfilerStep#1", 0, 100), ("ProfilerStep#9", 300, 10)])
    s = find_steps(t)
    assert s.inc_numbers.tolist() == [1, 2] and s.excluded == [] and not s.stretched
    assert s.start.tolist() == [0, 100] and s.end.tolist() == [100, 200]


def test_no_steps_one_window():
    t = make_trace(cpu=[("aten::mm", 10, 20)], runtime=[("cudaLaunchKernel", 12, 2, 1)],
                   gpu=[(K, "k", 40, 10, 1)], first_last=(5, 60))
    s = find_steps(t)
    assert not s.found and s.count == 1 and s.window == (5, 60)
    assert s.to_report()["found"] is False


# ---------------------------------------------------------------- breakdown
def test_priority_partition_with_overlaps():
    t = make_trace(
        cpu=[("ProfilerStep#1", 0, 100, UA), ("aten::whatever", 0, 100),
             ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 55, 25, UA),
             ("nccl:all_reduce", 82, 2)],
        runtime=[("cudaLaunchKernel", 0, 50, 1), ("cuLaunchKernel", 52, 2, 2)],
        gpu=[(K, "gemm", 10, 20, 1), (CP, "Memcpy HtoD (Pageable -> Device)", 20, 20, 2),
             (MS, "Memset (Device)", 35, 10, 3), (K, "ncclDevKernel_AllReduce", 85, 10, 4)])
    s = find_steps(t)
    assert (s.inc_start[0], s.inc_end[0]) == (0, 100)
    b = step_breakdown(t, s)
    us = b["breakdown_us"]
    # kernel 10-30; memcpy 30-40; memset 40-45; comm 82-84 (cpu) + 85-95 (kernel);
    # runtime 0-10, 45-50 and 52-54 (cuda_driver counts); dataloader 55-80;
    # cpu exec 50-52, 54-55, 80-82, 84-85, 95-100; nothing is left
    assert us == pytest.approx({"kernel": 20, "memcpy": 10, "memset": 5, "communication": 12,
                                "runtime": 17, "dataloader": 25, "cpu_exec": 11, "other": 0})
    assert b["avg_step_us"] == 100
    assert sum(b["breakdown_pct"].values()) == pytest.approx(100)
    assert b["breakdown_per_step"][0]["step"] == 1 and b["breakdown_per_step"][0]["total_us"] == 100
    ib = input_bound(t, s)
    assert ib["input_bound_pct"] == pytest.approx(25)
    assert ib["input_transfer_pct"] == pytest.approx(10)  # HtoD 20-40 minus kernel 10-30
    assert ib["xprof_input_pct"] == pytest.approx(35)
    assert ib["verdict"] == "highly input-bound" and ib["severity"] == "high"
    ev = ib["evidence"]
    assert ev["num_workers_zero"] and ev["dataloader_iterators"] == ["_SingleProcessDataLoaderIter"]
    assert ev["pageable_h2d_copies"] == 1 and ev["pageable_h2d_us"] == 20
    assert ev["slowest_steps"] == [{"step": 1, "step_us": 100, "dataloader_us": 25}]


def test_comm_kernel_names():
    for name in ["ncclKernel_AllReduce_RING_LL_Sum_float", "ncclDevKernel_Generic", "rcclGenericKernel",
                 "void vllm::cross_device_reduce_1stage<half, 8>", "multimem_all_reduce_kernel",
                 "one_shot_all_reduce_kernel<float>", "two_shot_all_reduce_kernel"]:
        assert is_comm_kernel_name(name), name
    assert not is_comm_kernel_name("volta_sgemm_128x64_nn")


def test_input_bound_thresholds():
    assert verdict_for(20.0) == ("highly input-bound", "high")
    assert verdict_for(19.99) == ("moderately input-bound", "medium")
    assert verdict_for(5.0) == ("moderately input-bound", "medium")
    assert verdict_for(4.9) == ("not input-bound", "ok")


def test_input_bound_is_ratio_of_sums():
    dl = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
    t = make_trace(cpu=[("ProfilerStep#1", 0, 100, UA), (dl, 0, 50, UA),
                        ("ProfilerStep#2", 100, 300, UA), (dl, 100, 30, UA)])
    ib = input_bound(t, find_steps(t))
    assert ib["input_bound_pct"] == pytest.approx(100 * 80 / 400)
    assert [p["input_bound_pct"] for p in ib["per_step"]] == pytest.approx([50, 10])
    assert ib["stats"]["mean"] == pytest.approx(30) and ib["stats"]["max"] == pytest.approx(50)
    assert not ib["evidence"]["num_workers_zero"]


# ---------------------------------------------------------------- GPU
def test_sm_efficiency_with_concurrent_kernels():
    # 0-10 one kernel at 0.5; 5-15 another at 0.75 (sum 1.25 -> 1 on 5-10); 15-20 idle
    assert sm_efficiency_integral(np.array([0., 5.]), np.array([10., 15.]), np.array([0.5, 0.75])) == \
        pytest.approx(0.5 * 5 + 1.0 * 5 + 0.75 * 5)
    t = make_trace(cpu=[("ProfilerStep#1", 0, 20, UA)],
                   gpu=[(K, "a", 0, 10, 1, 0, 7, 0.5, 40), (K, "b", 5, 10, 2, 0, 8, 0.75, 80),
                        (K, "c", 15, 10, 3, 0, 7, np.inf, 10),  # "inf": skipped; half outside
                        (K, "d", 0, 1, 4, 1, 7, np.nan, np.nan)])
    s = find_steps(t)
    na = {}
    g = gpu_metrics(t, s, not_available=na)
    assert g["0"]["utilization_pct"] == pytest.approx(100)
    assert g["0"]["est_sm_efficiency_pct"] == pytest.approx(100 * (2.5 + 5 + 3.75) / 20)
    # weights clipped to the window: 10, 10, 5
    assert g["0"]["est_achieved_occupancy_pct"] == pytest.approx((40 * 10 + 80 * 10 + 10 * 5) / 25)
    assert clipped_kernel_weights(t, (0, 20)).tolist() == [10, 10, 5, 1]
    assert g["1"]["est_sm_efficiency_pct"] is None and "gpu.1.est_sm_efficiency_pct" in na
    assert g["1"]["est_achieved_occupancy_pct"] is None and "gpu.1.est_achieved_occupancy_pct" in na


def test_cpu_only_has_no_gpu():
    t = make_trace(cpu=[("ProfilerStep#1", 0, 20, UA)])
    na = {}
    g = gpu_metrics(t, find_steps(t), not_available=na)
    assert g == {} and "gpu" in na


def test_idle_breakdown_classes():
    # stream 7: k1 0-10, k2 launched at 5 runs 15-20 (gap 5 < 30: kernel wait),
    # k3 launched at 100 (after k2 ended): host wait 20-110; k4 launched early: gap 50 other
    t = make_trace(runtime=[("cudaLaunchKernel", 0, 1, 1), ("cudaLaunchKernel", 5, 1, 2),
                            ("cudaLaunchKernel", 100, 1, 3), ("cudaLaunchKernel", 101, 1, 4)],
                   gpu=[(K, "k1", 0, 10, 1), (K, "k2", 15, 5, 2), (K, "k3", 110, 10, 3), (K, "k4", 170, 10, 4)])
    r = idle_breakdown(t, np.ones(4, bool))
    assert r["span_us"] == 180 and r["idle_us"] == 145
    assert (r["host_wait_us"], r["kernel_wait_us"], r["other_us"]) == (90, 5, 50)


# ---------------------------------------------------------------- signals
def test_sync_ops_and_their_causes():
    t = make_trace(
        cpu=[("ProfilerStep#1", 0, 100, UA), ("aten::item", 10, 30), ("aten::_local_scalar_dense", 12, 20),
             ("aten::copy_", 50, 20), ("aten::to", 75, 10)],
        runtime=[("cudaStreamSynchronize", 15, 10, 1),
                 ("cudaMemcpy", 55, 10, 2),  # DtoH: blocking
                 ("cudaMemcpy", 76, 5, 3),  # HtoD: not counted
                 ("cudaDeviceSynchronize", 95, 20, 4)],  # clipped to the host step: 5
        gpu=[(CP, "Memcpy DtoH (Device -> Pageable)", 56, 5, 2), (CP, "Memcpy HtoD (Pageable -> Device)", 77, 3, 3)])
    s = find_steps(t)
    r = sync_signal(t, s)
    assert r["sync_us"] == pytest.approx(25)
    ops = {o["op"]: o["sync_us"] for o in r["top_ops"]}
    assert ops == {"aten::_local_scalar_dense": 10, "aten::copy_": 10, "(no op)": 5}
    assert {c["name"] for c in r["calls"]} == {"cudaStreamSynchronize", "cudaMemcpy", "cudaDeviceSynchronize"}


def test_communication_overlap_and_launch():
    t = make_trace(cpu=[("ProfilerStep#1", 0, 100, UA)],
                   runtime=[("cudaLaunchKernel", 1, 4, 1), ("cuLaunchKernel", 6, 2, 2)],
                   gpu=[(K, "ncclDevKernel_AllReduce", 10, 40, 1, 0, 9), (K, "gemm", 30, 40, 2)])
    s = find_steps(t)
    c = communication_signal(t, s)
    assert c["comm_us"] == 40 and c["overlap_pct"] == pytest.approx(50)
    assert c["comm_pct_of_kernel_time"] == pytest.approx(100 * 40 / 60)
    l = launch_signal(t, s)
    assert l["launch_us"] == 6 and l["kernels_per_step"] == 2
