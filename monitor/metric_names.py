"""The exported metric names: one contract for the exporter, alert rules, Grafana and the app.

Prefix ``verlmon_``; base units; ``_total`` on counters; identity in ``*_info`` series. GPU data
series carry the label ``gpu`` (index) only; the node is the scrape's ``instance``/``node``
target label (``verlmon_node_info{node=...}`` carries the exporter's ``--node`` name).
Ratios are 0..1. The full table with types and labels is in docs/metrics.md.
"""

PREFIX = "verlmon_"

# --- identity and health
BUILD_INFO = "verlmon_build_info"  # gauge {version}
NODE_INFO = "verlmon_node_info"  # gauge {node, backend}
COLLECTOR_SUCCESS = "verlmon_collector_success"  # gauge {collector}
COLLECTOR_DURATION = "verlmon_collector_duration_seconds"  # gauge {collector}
COLLECTOR_ERRORS = "verlmon_collector_errors_total"  # counter {collector}
STORE_UP = "verlmon_store_up"  # gauge
STORE_WRITE_ERRORS = "verlmon_store_write_errors_total"  # counter
STORE_DROPPED = "verlmon_store_dropped_rows_total"  # counter {reason}
WINDOW_DROPPED = "verlmon_window_dropped_rows_total"  # counter {kind}
THREAD_RESTARTS = "verlmon_exporter_thread_restarts_total"  # counter {thread}
SLACK_MESSAGES = "verlmon_slack_messages_total"  # counter {outcome}
SLACK_DROPPED = "verlmon_slack_dropped_total"  # counter
SLACK_FAILED = "verlmon_slack_failed_attempts_total"  # counter {reason}
SLACK_PENDING = "verlmon_slack_pending_messages"  # gauge: messages waiting in the outbox
WANDB_ALERTS = "verlmon_wandb_alerts_total"  # counter {outcome}: run.alert sent/failed/dropped
LOG_DROPPED = "verlmon_log_dropped_lines_total"  # counter {log}: lines over the length cap
LOG_UNRECOVERED = "verlmon_log_unrecovered_total"  # counter {log}: saved positions whose file
#   was rotated away or truncated while the exporter was down, with no copy found
LOG_ANOMALIES = "verlmon_log_anomalies_total"  # counter {log, reason}: what would have lost or
#   replaced a record, handled: step_time_clash, rewritten, not_regular, bad_timestamp,
#   side_file (a file beside the log, its .arrivals or .exit, not used)
DETECTOR_ERRORS = "verlmon_detector_errors_total"  # counter {detector}: detector exceptions
HTTP_CONNECTIONS = "verlmon_http_connections"  # gauge: open now
HTTP_CONNECTIONS_CLOSED = "verlmon_http_connections_closed_total"  # counter {reason}
HTTP_REQUESTS_REFUSED = "verlmon_http_requests_refused_total"  # counter {reason}
LABELS_TRUNCATED = "verlmon_label_values_truncated_total"  # counter: over the length cap

# --- GPU (nvml / sim backends)
GPU_INFO = "verlmon_gpu_info"  # gauge {gpu, uuid, name}
GPU_UP = "verlmon_gpu_up"  # gauge {gpu}
GPU_UTIL = "verlmon_gpu_utilization_ratio"  # gauge {gpu}
GPU_SM_ACTIVE = "verlmon_gpu_sm_active_ratio"  # gauge {gpu} (GPM)
GPU_SM_OCCUPANCY = "verlmon_gpu_sm_occupancy_ratio"  # gauge {gpu} (GPM)
GPU_TENSOR_ACTIVE = "verlmon_gpu_tensor_active_ratio"  # gauge {gpu} (GPM)
GPU_DRAM_ACTIVE = "verlmon_gpu_dram_active_ratio"  # gauge {gpu} (GPM)
GPU_MEM_USED = "verlmon_gpu_memory_used_bytes"  # gauge {gpu}
GPU_MEM_TOTAL = "verlmon_gpu_memory_total_bytes"  # gauge {gpu}
GPU_POWER = "verlmon_gpu_power_watts"  # gauge {gpu}
GPU_ENERGY = "verlmon_gpu_energy_joules_total"  # counter {gpu}
GPU_TEMP = "verlmon_gpu_temperature_celsius"  # gauge {gpu}
GPU_SM_CLOCK = "verlmon_gpu_sm_clock_hertz"  # gauge {gpu}
GPU_PROCESSES = "verlmon_gpu_compute_processes"  # gauge {gpu}
GPU_CLOCK_EVENT = "verlmon_gpu_clock_event_active"  # gauge {gpu, reason}: 1 while active
GPU_PCIE_TX = "verlmon_gpu_pcie_transmit_bytes_per_second"  # gauge {gpu} (GPM)
GPU_PCIE_RX = "verlmon_gpu_pcie_receive_bytes_per_second"  # gauge {gpu} (GPM)
GPU_NVLINK_TX = "verlmon_gpu_nvlink_transmit_bytes_per_second"  # gauge {gpu} (GPM)
GPU_NVLINK_RX = "verlmon_gpu_nvlink_receive_bytes_per_second"  # gauge {gpu} (GPM)
GPU_XID = "verlmon_gpu_xid_errors_total"  # counter {gpu, xid}
# Activity integrated over the exporter's own samples: exact rates at any scrape interval.
GPU_SAMPLED_SECONDS = "verlmon_gpu_sampled_seconds_total"  # counter {gpu}
GPU_BUSY_SECONDS = "verlmon_gpu_busy_seconds_total"  # counter {gpu}: seconds x utilization
GPU_SM_ACTIVE_SECONDS = "verlmon_gpu_sm_active_seconds_total"  # counter {gpu}: x SM activity
GPU_SAMPLES = "verlmon_gpu_samples_total"  # counter {gpu}: samples counted above

# --- host (psutil)
HOST_CPU_MAX_CORE = "verlmon_host_cpu_max_core_ratio"  # gauge
HOST_CPU_AVG = "verlmon_host_cpu_average_ratio"  # gauge
HOST_IOWAIT = "verlmon_host_cpu_iowait_ratio"  # gauge
HOST_DISK_READ = "verlmon_host_disk_read_bytes_total"  # counter
HOST_DISK_WRITTEN = "verlmon_host_disk_written_bytes_total"  # counter
HOST_NET_RX = "verlmon_host_network_receive_bytes_total"  # counter
HOST_NET_TX = "verlmon_host_network_transmit_bytes_total"  # counter
HOST_MEM_USED = "verlmon_host_memory_used_bytes"  # gauge
HOST_MEM_TOTAL = "verlmon_host_memory_total_bytes"  # gauge
TRAIN_PROC_CPU = "verlmon_training_process_cpu_ratio"  # gauge (1.0 = one core)
TRAIN_PROC_RSS = "verlmon_training_process_resident_bytes"  # gauge

# --- verl log
TRAIN_STEP = "verlmon_training_step"  # gauge: last step number seen
STEPS = "verlmon_training_steps_total"  # counter: step records parsed
STEP_DURATION = "verlmon_step_duration_seconds"  # gauge: last step's total
PHASE_DURATION = "verlmon_phase_duration_seconds"  # gauge {phase}: last step's phases
THROUGHPUT = "verlmon_throughput_tokens_per_second"  # gauge: perf/throughput (per GPU)
LAST_STEP_TS = "verlmon_last_step_timestamp_seconds"  # gauge: unix time of the last step
SINCE_LAST_STEP = "verlmon_seconds_since_last_step"  # gauge
STEP_DATA_WAIT = "verlmon_step_data_wait_seconds"  # gauge: last step's time before its timer
MEM_RESERVED_PEAK = "verlmon_memory_reserved_peak_bytes"  # gauge: perf/max_memory_reserved_gb
LOG_LINES = "verlmon_log_lines_total"  # counter {log}
LOG_PARSE_ERRORS = "verlmon_log_parse_errors_total"  # counter {log}
LOG_EVENTS = "verlmon_log_events_total"  # counter {kind}

# --- NCCL Inspector
NCCL_OPS = "verlmon_nccl_operations_total"  # counter {coll, comm, rank}
NCCL_BYTES = "verlmon_nccl_bytes_total"  # counter {coll, comm, rank}
NCCL_EXEC = "verlmon_nccl_exec_seconds_total"  # counter {coll, comm, rank}
NCCL_BUSBW = "verlmon_nccl_bus_bandwidth_bytes_per_second"  # gauge {coll, comm, rank}: latest
NCCL_DROPPED = "verlmon_nccl_dropped_total"  # counter {reason}
NCCL_COMM_SHARE = "verlmon_nccl_comm_share_ratio"  # gauge: over the sampling window

# --- rollout engines (vLLM / SGLang servers; exporters/collectors/rollout_engine.py)
#: data series carry {server, engine, model}; health series {server} (and reason)
ROLLOUT_KV_CACHE = "verlmon_rollout_kv_cache_usage_ratio"  # gauge
ROLLOUT_REQUESTS = "verlmon_rollout_requests"  # gauge {state: running|waiting|paused}
ROLLOUT_PREEMPTIONS = "verlmon_rollout_preemptions_total"  # counter (SGLang: retractions)
ROLLOUT_GEN_TOKENS = "verlmon_rollout_generation_tokens_total"  # counter
ROLLOUT_QUEUE_TIME = "verlmon_rollout_queue_time_seconds"  # summary (_sum, _count)
ROLLOUT_E2E_LATENCY = "verlmon_rollout_e2e_latency_seconds"  # summary (_sum, _count)
ROLLOUT_SLEEPING = "verlmon_rollout_sleeping"  # gauge: 1 asleep (vLLM sleep mode)
ROLLOUT_SERVER_UP = "verlmon_rollout_server_up"  # gauge {server}
ROLLOUT_SCRAPE_DURATION = "verlmon_rollout_scrape_duration_seconds"  # gauge {server}
ROLLOUT_SCRAPE_ERRORS = "verlmon_rollout_scrape_errors_total"  # counter {server, reason}

# --- counters of the verl log: exact shares over any range with rate()/increase()
PHASE_SECONDS = "verlmon_phase_seconds_total"  # counter {phase}: phase seconds of every step
STEP_SECONDS = "verlmon_step_seconds"  # histogram: step seconds (_bucket, _sum, _count)
DATA_WAIT_SECONDS = "verlmon_data_wait_seconds_total"  # counter: time before step timers
# --- per-phase GPU activity on every node (the driver's timeline; monitor/live/phase_timeline.py)
PHASE_GPU_SECONDS = "verlmon_phase_gpu_seconds_total"  # counter {phase, gpu}
PHASE_GPU_SM_ACTIVE_SECONDS = "verlmon_phase_gpu_sm_active_seconds_total"  # counter {phase, gpu}
PHASE_GPU_UTIL_SECONDS = "verlmon_phase_gpu_utilization_seconds_total"  # counter {phase, gpu}
PHASE_GPU_SAMPLES = "verlmon_phase_gpu_samples_total"  # counter {phase, gpu}
# --- goodput ledger (monitor/live/goodput_counter.py, docs/goodput.md)
GPU_SECONDS = "verlmon_gpu_seconds_total"  # counter {cause, node, gpu}: GPU-seconds by cause
GOODPUT_STEPS = "verlmon_goodput_steps_total"  # counter {node}: steps the ledger has counted
RUN_FINISHED = "verlmon_run_finished"  # gauge: 1 once the followed run has ended, else 0
RUN_END_TS = "verlmon_run_end_timestamp_seconds"  # gauge: when the finished run ended
#: Histograms: each is exposed as NAME_bucket, NAME_sum and NAME_count.
HISTOGRAMS: tuple[str, ...] = (STEP_SECONDS,)

# --- hangs: Flight Recorder / py-spy rounds (monitor/live/hang_dumps.py)
FR_COLLECTIVE_SEQ = "verlmon_fr_collective_seq"  # gauge {rank, pg, state: enqueued|started|completed}
FR_PENDING_INFO = "verlmon_fr_pending_info"  # gauge {rank, pg, collective, state, seq}
HANG_CULPRIT_INFO = "verlmon_hang_culprit_info"  # gauge {rank, pid, gpu, collective, seq, frame}
HANG_WHERE_INFO = "verlmon_hang_where_info"  # gauge {role, pid, place, phase, frame, detail}: 1 = stuck
HANG_DUMP_ROUNDS = "verlmon_hang_dump_rounds_total"  # counter {method, result}
HANG_DUMP_SECONDS = "verlmon_hang_dump_seconds"  # gauge: the last round's duration
HANG_ACTIONS = "verlmon_hang_actions_total"  # counter {action, result}: what --on-hang did
HANG_HELD_SECONDS = "verlmon_hang_held_seconds"  # gauge {role, pid, place, phase, frame}
HANG_HELD_NORMAL_SECONDS = "verlmon_hang_held_normal_seconds"  # gauge: that place's normal time
HANG_HELD_LIMIT_SECONDS = "verlmon_hang_held_limit_seconds"  # gauge: held past it: a hang
HANG_PYSPY_READY = "verlmon_hang_pyspy_ready"  # gauge: 1 py-spy can read the job here, 0 not
HANG_PYSPY_PROBLEM_INFO = "verlmon_hang_pyspy_problem_info"  # gauge {problem}: why not, the fix
HANG_JOB_PROCESSES = "verlmon_hang_job_processes"  # gauge: processes proven the job's
# --- the job across its attempts (monitor/live/attempt_counter.py, docs/attempts.md)
JOB_SECONDS = "verlmon_job_seconds_total"  # counter {bucket}: wall seconds over all attempts
JOB_ATTEMPTS = "verlmon_job_attempts_total"  # counter: attempts started
JOB_FAILURES = "verlmon_job_failures_total"  # counter {ended_by}: attempts that failed
JOB_STEPS_REDONE = "verlmon_job_steps_redone_total"  # counter: steps done again after a resume
JOB_SAVES = "verlmon_job_checkpoint_saves_total"  # counter: checkpoint saves
JOB_ETTR = "verlmon_job_ettr_ratio"  # gauge: productive / wall over all attempts

# --- flags (detectors run live in the exporter)
FLAG_ACTIVE = "verlmon_flag_active"  # gauge {kind, severity, node, gpu, phase}: 1 while open
FLAG_INFO = "verlmon_flag_info"  # gauge {kind, severity, node, gpu, phase, evidence, advice}
FLAGS_RAISED = "verlmon_flags_raised_total"  # counter {kind, severity}: 0 for each from start
