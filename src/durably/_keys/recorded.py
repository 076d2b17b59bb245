"""How digests and code fingerprints name durably's own functions and classes.

A library's function or class is recorded by module, name and version
(``numpy.linalg.norm@2.1.0``). durably's own are recorded by the module that defined them in
release 0.1.0, not by where they are now: moving code between durably's modules never changes
a user's cache keys (a task that calls ``durably.interrupt``, an argument that is a
``durably.Retry``). Written by ``tests/fixtures/make_recorded_names.py``; checked by
``tests/test_store_compat.py``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["recorded_module"]

#: (the module release 0.1.0 defined them in, the module that defines them now, their names)
_MOVED = (
    ("durably._blobs", "durably._store.disk.blobs",
     "FileValue Garbage LinkIn _safe_stem _write_new as_spilled blob_ref clean_tmp content_mac "
     "copy_with_header disk_class large_for_cache large_from_cache open_blob place "
     "same_content set_aside set_aside_before share_bits share_file subdir temp_name "
     "valid_blob_name"),
    ("durably._bytecode", "durably._keys.bytecode",
     "_Refs _Scan _event _generic _merge _scan_code"),
    ("durably._checkpoint", "durably._store.disk.checkpoint",
     "_checkpoint _close _close_at_exit _hold _holding _interrupt_and_wait _loop _serve "
     "_start_locked _uri release request wait_idle"),
    ("durably._class_code", "durably._keys.class_code",
     "_compute_layout _encode_class_code _functions_of _generated _is_constant class_code "
     "class_parts"),
    ("durably._cli_support", "durably._cli.support",
     "_CommandError _CtrlC _UsageError _duration _fail _fields _jsonable _parse_argument "
     "_parse_call _parse_duration _parse_json _parse_size _percent _size _table _usage"),
    ("durably._config", "durably._runtime.config",
     "configure default_store"),
    ("durably._context", "durably._runtime.context",
     "Cutoff Executing RunContext StopRun _flush_before_fork _leave_run_in_child live_run "
     "user_stacklevel"),
    ("durably._decorators", "durably._decorators.attempt",
     "_as_interrupt _handle _leaves _paused _require_interrupted _settle _settle_submitted"),
    ("durably._decorators", "durably._decorators.entrypoints",
     "BoundEntrypoint Entrypoint _keep_option _warn_unused_update entrypoint entrypoint "
     "entrypoint fork"),
    ("durably._decorators", "durably._decorators.pickling",
     "_ByReference _LaterTask _OwnClass _main_task _main_task_later _reduce _reduce_bound "
     "_reduce_main_task _reduce_nameless _resolve _under_cloudpickle"),
    ("durably._decorators", "durably._decorators.stream",
     "_AsyncStream _Listener _stream_async _stream_sync"),
    ("durably._decorators", "durably._decorators.tasks",
     "BoundTask Task task task task"),
    ("durably._decorators", "durably._decorators.wrapper",
     "_check_bare _describe _instance_of"),
    ("durably._effects", "durably._runtime.effects",
     "Effects _is_ndarray _may_change _restore _restore_attributes _restore_object _state "
     "before changed mutable restored warn_once"),
    ("durably._encoders", "durably._keys.encoders",
     "_bool _bytearray _bytes _cached_names _complex _date _datetime _decimal _dict "
     "_dtype_text _float _fraction _frozenset _int _is_x87 _list _memoryview _none _padded "
     "_pandas_metadata _pandas_values _path _probe_attrs _probe_builtin_subclass "
     "_probe_callable _probe_dataclass _probe_enum _probe_namedtuple _probe_numpy "
     "_probe_pandas _probe_pydantic _pydantic_more _range _set _significant _slice _slot_names "
     "_str _time _timedelta _tuple _tz _uuid type_path without_cached"),
    ("durably._executors", "durably._executors.fanout",
     "_FanOut _drain _drive _drive_async _ended_unseen _halt _in_state _items _not_cancelled "
     "_put_back _scan _still_waited _stopping _take _unhalt map_async map_sync"),
    ("durably._executors", "durably._executors.items",
     "Target _Failed _Item _Journaled _future_outcome _journal_failure _outcomes_of _run_here "
     "_run_here_async"),
    ("durably._executors", "durably._executors.pools",
     "Dask Executor Process Thread _BadWorkers _Pooled _Submitted _check_workers "
     "_resolve_executor _settle _shared_thread _submitted_async _target_of submit_async "
     "submit_sync"),
    ("durably._explain", "durably._runtime.explain",
     "Explanation _differs _moved_classes explain"),
    ("durably._failures", "durably._runtime.failures",
     "ReplayedFailure _find_class _parts _rebuilt _stand_in escaped note raised_event released "
     "replayable replayed"),
    ("durably._files", "durably._keys.files",
     "File file file_stamp"),
    ("durably._fingerprint", "durably._keys.fingerprint",
     "_Definitions _ImportClock _StateMark _Walker _fields_of _is_main_block _module_of "
     "_names_in _type_text _write_definition class_fingerprint_parts definition_digest "
     "fingerprint_function nameless_callable"),
    ("durably._graph_builder", "durably._graph.builder",
     "GraphChangedError GraphValidationError InvalidRouteError StateGraph StepLimitError "
     "_Router _caller_module _command_destinations _reach"),
    ("durably._graph_state", "durably._graph.state",
     "InvalidUpdateError Schema _alias _same _what_changed describe_changes parts_of"),
    ("durably._graph_structure", "durably._graph.structure",
     "Command GraphStructure Send _command _dot _mm"),
    ("durably._hashing", "durably._keys.canonical",
     "Encoder _callable_name _class_code _first _has_content _is_user_code "
     "_without_cached_state register_encoder too_common"),
    ("durably._hashing", "durably._keys.hashing",
     "_attributes _encode_from _general_arguments _scalar_sequence _too_deep class_digests "
     "digest digest_each encode_arguments encode_positional locate_part locate_undigestable "
     "positional_plan trace_digest trace_digests"),
    ("durably._history", "durably._runtime.history",
     "Checkpoint _short_loaded checkpoints find_checkpoint make_fork unused_update"),
    ("durably._interrupt", "durably._runtime.interrupt",
     "Interrupt InterruptSignal _answer_of_a_changed_step _asker_code _id_key _near_id "
     "_nondeterministic get_writer idempotency_key interrupt pending_interrupts record_answers"),
    ("durably._keep", "durably._runtime.keep",
     "Keeper _key _step_id keep_finished kept_steps rerun_after_code_change"),
    ("durably._lease", "durably._store.lease",
     "Owner _beat_loop _before_fork _machine _no_renewal_at_exit _proc_stat _start_ticks "
     "_threads_live beat hold let_go me"),
    ("durably._maintenance", "durably._store.disk.maintenance",
     "_Entry _empty_volume _entries _key_tasks _rate _step_counts _tasks_of cache_stats clear "
     "prune task_identities"),
    ("durably._origin", "durably._keys.origin",
     "_distributions _find_version _has_user_file _import_user_module _is_user_path "
     "_package_version _provides _resolve_import _spec_is_user _system_prefixes is_user_module"),
    ("durably._progress", "durably._executors.progress",
     "_Progress _in_notebook _isatty progress_enabled"),
    ("durably._records", "durably._store.disk.rows",
     "_id_hash _rollback _running _sorted_json _spans compact_replay discard_leftover garbage "
     "immediate key_row pack_ranges pack_replays replayed_in_ranges row_hash row_hash_sql "
     "run_row step_from_row step_row step_sid unpack_ranges unpack_replays"),
    ("durably._records", "durably._store.records",
     "EventRecord KeyRecord ReplayRange RunRecord StepRecord now"),
    ("durably._records", "durably.store",
     "Store"),
    ("durably._repair", "durably._store.disk.repair",
     "_check_ranges _collect repair_run seal_old_blobs"),
    ("durably._retry", "durably._runtime.retry",
     "Retry await_with_timeout call_with_timeout check_timeout retrying to_retry"),
    ("durably._revalidate", "durably._keys.revalidate",
     "Fingerprint Unchecked _AsWalked _ByIdentity _FirstPickler _Nested _Pickler _check_of "
     "_digest_again _encoded _grouped _identified _is_plain _pickle_digest _pickled _plain "
     "_quick full_digest registry_ids"),
    ("durably._run", "durably._runtime.run",
     "Run _store_of delete_runs executing get_run list_runs"),
    ("durably._runtime", "durably._runtime.attempt",
     "Started _Deferred _Renewal _abandon _answer_dependent _attempt_record _end_attempt "
     "_ended_run _final_record _held _journaled _leave _lost _one_transaction _resolve_run "
     "_restore_cache _resumed_meanwhile _slug _started_data _write_final begin_run end_run "
     "is_cancelled run_status validate_run_id"),
    ("durably._runtime", "durably._runtime.call",
     "_acall_body _acall_with_policy _call_with_policy _file_inputs _file_stamps _last_try "
     "_mark_started _occurrence_id _replay_failure _retry_asks_again _try_label _write_queued "
     "begin_step cached_now call_async call_path call_sync execute_sync serve_cached"),
    ("durably._runtime", "durably._runtime.spec",
     "Spec _bound_to_object _name_of_nameless _unbound_fix module_identity step_identity"),
    ("durably._runtime", "durably._runtime.step",
     "Call _load _load_cached _loads_back"),
    ("durably._seal", "durably._store.integrity",
     "SigningKey _group _private_group _user check_large_header check_parts check_private "
     "env_key key_from key_from_file large_header open_plain open_seal read_large_header scan "
     "seal unseal"),
    ("durably._serde", "durably._keys.serde",
     "Spilled Unreadable _Discard _Local _MainPickler _Sink _at _attribute _dumps_fresh "
     "_found_in _main_as_module _os_write _plain_pickler dumps host_tag loads "
     "locate_unpicklable main_global open_regular pickler_class set_spill_dir spill_bytes "
     "write_all"),
    ("durably._state", "durably._keys.state",
     "_StateFinder _class_holder _default_of _holds_mutable _is_atom _is_code _is_stateful "
     "_iterator_types _mutable_kind _static_attr _unwrap _wrapped_of"),
    ("durably._store", "durably._store.disk.base",
     "_Translate _WriteJournal _is_corrupt"),
    ("durably._store", "durably._store.disk.cache",
     "_cache_fetch _index_damaged _insert_new_small"),
    ("durably._store", "durably._store.disk.signing",
     "set_default_key"),
    ("durably._store", "durably._store.disk.steps",
     "ReadAhead _in_call_order"),
    ("durably._store", "durably._store.disk.store",
     "DiskStore _Batch _disk_full _new_locks_in_child _read_only _wal_mode _write_replacing"),
    ("durably._store", "durably._store.disk.values",
     "Sealed"),
    ("durably._threads", "durably._runtime.threads",
     "_warn innermost thread_run"),
    ("durably._tracer", "durably._trace.tracer",
     "Edge Event Node RunGraph _ShortRepr _collapse _record_repr_args build_graph flow_digests "
     "inputs_repr short_repr"),
    ("durably._wal", "durably._store.disk.wal",
     "_index_header lost_commits"),
    ("durably._worker", "durably._decorators.pickling",
     "_rebuild_task _task_by_value"),
    ("durably._worker", "durably._executors.worker",
     "_JobPickler _Outcome _RemoteTraceback _Unpickler _call_remote _describe_store _gone "
     "_keep_existing _load_head _loads _pack _pack_arguments _pack_failure _pack_part _run_job "
     "_set_new_class_state _unpack_outcome _use_store watch_parent"),
    ("durably._worker", "durably._runtime.retry",
     "Seceded"),
    ("durably.stategraph", "durably._graph.checkpoints",
     "Sent StateSnapshot StepResult Writes _pickled_state _splice _spliced"),
    ("durably.stategraph", "durably._graph.compiled",
     "CompiledGraph"),
    ("durably.stategraph", "durably._graph.execution",
     "_Cancel _run_beside_loop"),
    ("durably.stategraph", "durably._graph.routing",
     "_as_send _is_command _target_name _without"),
    ("durably.stategraph", "durably._graph.superstep",
     "_Handoff _deepcopy _merged _writes"),
    ("durably.testing", "durably._store.memory",
     "MemoryStore"),
)

_RECORDED = {f"{now}.{name}": then for then, now, names in _MOVED for name in names.split()}


def recorded_module(module: Any, qualname: str) -> Any:
    """The module a digest records for the function or class ``module.qualname`` (``module``
    as ``__module__`` gives it: a str, or None): for one of durably's, the module release
    0.1.0 defined it in; else ``module`` itself.

    Example:
        >>> recorded_module("durably._runtime.interrupt", "interrupt")
        'durably._interrupt'
        >>> recorded_module("numpy", "ndarray")
        'numpy'
    """
    if type(module) is str and module.startswith("durably."):
        return _RECORDED.get(f"{module}.{qualname.partition('.')[0]}", module)
    return module
