"""The config dict an AgentJet client sends with sync_train_config.

AgentJet's `SwarmClient.sync_train_config(job)` posts
`{"yaml_as_string": yaml.safe_dump(job.config.to_dict(), sort_keys=False)}`. That dict is
the hydra-expanded default config: a top-level `ajet:` tree (the only meaningful part), the
untouched verl sections, then `defaults` and `hydra`. The key tree and the `ajet.*` defaults
follow docs/dev/agentjet-client-notes.md §4; the values here are written for this test (the
verl sections hold a realistic handful of keys each, not verl's full defaults), keeping the
YAML constructs a real dump contains: `${...}` interpolations, `re:` regex strings, long
strings PyYAML folds over several lines, `1.0e-06`, `{}`, `[]`, nulls and lists.
"""

import copy

import yaml

# A prompt long enough (and with spaces) that yaml.safe_dump folds it over lines (width 80).
_LONG_GRADER_TEXT = (
    "You are a careful grader. Read the task, the reference answer and the agent's final "
    "answer, then decide whether the final answer is correct. Ignore formatting differences "
    "and answer with a single score between 0 and 1."
)
_LONG_QUERY_TEXT = (
    "Rewrite the following question so that it keeps the same answer but uses different "
    "wording, different names and different numbers where this does not change the result."
)

_AJET_DEFAULTS = {
    "project_name": "ajet_default_project",
    "experiment_name": "read_yaml_name",
    "experiment_dir": "auto",
    "backbone": "verl",
    "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
    "data": {"max_prompt_length": 3000, "max_response_length": 15000, "train_batch_size": 32},
    "rollout": {
        "user_workflow": None,
        "force_disable_toolcalls": False,
        "max_env_worker": 128,
        "gamma": 1.0,
        "compute_madness_checklist": ["nonsense"],
        "agent_madness_termination": True,
        "agent_madness_reward": 0.0,
        "max_response_length_in_one_turn": 4096,
        "max_model_len": 18000,
        "multi_turn": {"max_sample_per_task": 30, "max_steps": 30, "expected_steps": 1},
        "tensor_model_parallel_size": 1,
        "n_vllm_engine": 1,
        "max_num_seqs": 64,
        "name": "vllm",
        "gpu_memory_utilization": 0.85,
        "num_repeat": 4,
        "temperature": 0.9,
        "top_p": 1.0,
        "top_k": -1,
        "val_kwargs": {"temperature": 0.0, "top_k": -1, "top_p": 1.0, "do_sample": False},
    },
    "task_reader": {
        "type": "random_dummy",
        "jsonl_dataset_file": {
            "training": {"file_path": "/path/to/training/data.jsonl"},
            "validation": {"file_path": "/path/to/validation/data.jsonl"},
        },
        "env_service": {
            "env_type": "appworld",
            "env_url": "http://127.0.0.1:8080",
            "env_action_preference": "code",
            "training_split": "train",
            "validation_split": "dev",
        },
        "huggingface_dat_repo": {
            "dataset_path": "openai/gsm8k",
            "dataset_name": None,
            "training_split": "train",
            "validation_split": "test",
            "http_proxy_address": "",
        },
        "data_generation": {
            "document_reader": {"document_path": [], "languages": ["eng"], "chunk_size": 5120},
            "query_reader": {"type": "jsonl_dataset_file", "jsonl_dataset_file": {"training": {"file_path": None}}},
            "query_prompt": _LONG_QUERY_TEXT,
            "task_num": 10,
            "llm_model": "qwen-long",
            "llm_response_length": 8192,
            "num_workers": 32,
            "sampling_params": {"temperature": 0},
            "deduplication_filter": {"enabled": True, "params": {"similarity_threshold": 0.8, "db_path": "./.similarity_db"}},
        },
    },
    "task_judge": {
        "judge_type": "customized_protocol",
        "judge_protocol": None,
        "alien_llm_model": "qwen3-235b-a22b-instruct-2507",
        "alien_llm_response_length": 512,
        "rubrics_auto_grader": {
            "model_name": "qwen-max",
            "grader_mode": "pointwise",
            "language": "en",
            "query_field": "main_query",
            "answer_field": "final_answer",
            "reference_field": "answer",
            "grader_instruction": _LONG_GRADER_TEXT,
            "input_data_type": "jsonl_dataset_file",
            "jsonl_dataset_file": {"training": {"file_path": "tutorial/example_rm_auto_grader/rubrics_train.jsonl"}},
            "min_score": 0,
            "max_score": 1,
        },
    },
    "context_tracker": {
        "timeline_merging_policy": {"timeline_compare_level": "text", "ignore_tools": True},
        "fix_retokenization_drift": True,
        "log_tool_format_check": False,
        "log_tool_format_error_detail": False,
        "detect_timeline_snap": False,
        "alien_llm_model": "qwen3-235b-a22b-instruct-2507",
        "alien_llm_response_length": 512,
    },
    "debug": {
        "debug_max_parallel": 4,
        "debug_first_n_tasks": 2,
        "debug_vllm_port": 18000,
        "debug_vllm_seed": 12345,
        "debug_tensor_parallel_size": 4,
    },
    "trainer_common": {
        "val_before_train": False,
        "val_pass_n": 4,
        "val_only": False,
        "val_max_num_task_each_validation": None,
        "val_max_num_task_clip_method": "fix_seed_random_n",
        "val_print_to_markdown_file_path": None,
        "train_print_to_markdown_file_path": None,
        "save_freq": 20,
        "test_freq": 20,
        "total_training_steps": None,
        "total_epochs": 50,
        "nnodes": 1,
        "n_gpus_per_node": 8,
        "logger": "tensorboard",
        "algorithm": {"adv_estimator": "grpo"},
        "use_kl_in_reward": False,
        "kl_penalty_type": "kl",
        "mini_batch_num": 1,
        "fsdp_config": {"param_offload": True, "optimizer_offload": True},
        "optim": {
            "optimizer": "AdamW",
            "optimizer_impl": "torch.optim",
            "lr": 1.0e-06,
            "lr_warmup_steps_ratio": 0.0,
            "lr_warmup_steps": -1,
            "total_training_steps": -1,
            "weight_decay": 0.01,
            "betas": [0.9, 0.999],
            "min_lr_ratio": 0.0,
            "num_cycles": 0.5,
            "lr_scheduler_type": "constant",
            "zero_indexed_step": True,
            "grad_clip": 20.0,
        },
        "use_kl_loss": True,
        "kl_loss_coef": 0.002,
        "kl_loss_type": "low_var_kl",
        "ppo_epochs": 1,
        "loss_extra_scale_ratio": 1.0,
        "ulysses_sequence_parallel_size": 1,
        "checkpoint_base_dir": "./saved_checkpoints",
        "save_trajectory_as_json_file": False,
        "loss_weight_normalization_episode_level": False,
        "advantage_estimation_episode_level": False,
    },
    "lora": {
        "lora_rank": 0,
        "lora_alpha": 16,
        "target_modules": "all-linear",
        "load_format": "auto",
        "layered_summon": False,
    },
    "enable_swarm_mode": True,
    "enable_interchange_server": True,
    "interchange_server": {
        "interchange_method": "ipc",
        "interchange_server_port": 10086,
        "num_fastapi_process": 1,
        "max_fastapi_threads": 512,
        "max_inference_tracker_threads": 256,
        "already_started": False,
    },
    "swarm_mode_sample_collection_method": "rollout_until_finish_enough_tasks",
    "swarm_mode_sample_collection_max_cached_episodes": 9999,
    "task_runner": {"wrapper_type": "asyncio-with-gc", "wrapper_multiprocessing_timeout": 3600},
    "execute_test": False,
    "execute_testing_lambda": "",
    "trainer_verl": {},
}

# The verl sections, in the order a real dump has them. Only a handful of keys each.
_VERL_SECTIONS = {
    "actor_rollout_ref": {
        "hybrid_engine": True,
        "nccl_timeout": 600,
        "model": {
            "path": "~/models/deepseek-llm-7b-chat",
            "custom_chat_template": None,
            "external_lib": None,
            "override_config": {},
            "enable_gradient_checkpointing": True,
            "use_remove_padding": False,
            "lora_rank": 0,
            "target_modules": "all-linear",
            "exclude_modules": None,
        },
        "actor": {
            "strategy": "fsdp",
            "ppo_mini_batch_size": 256,
            "ppo_micro_batch_size_per_gpu": None,
            "use_dynamic_bsz": False,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.2,
            "loss_agg_mode": "token-mean",
            "use_kl_loss": False,
            "kl_loss_type": "low_var_kl",
            "checkpoint": {"save_contents": ["model", "optimizer", "extra"], "load_contents": "${.save_contents}"},
            "optim": {"lr": 1.0e-06, "lr_warmup_steps": -1, "weight_decay": 0.01, "betas": [0.9, 0.999], "clip_grad": 1.0},
            "fsdp_config": {"param_offload": False, "wrap_policy": {"min_num_params": 0}, "fsdp_size": -1},
        },
        "ref": {
            "strategy": "${actor_rollout_ref.actor.strategy}",
            "log_prob_micro_batch_size": None,
            "log_prob_use_dynamic_bsz": "${oc.select:actor_rollout_ref.actor.use_dynamic_bsz,false}",
        },
        "rollout": {
            "name": "vllm",
            "mode": "async",
            "temperature": 1.0,
            "top_k": -1,
            "top_p": 1,
            "prompt_length": "${oc.select:data.max_prompt_length,512}",
            "response_length": "${oc.select:data.max_response_length,512}",
            "dtype": "bfloat16",
            "gpu_memory_utilization": 0.5,
            "tensor_model_parallel_size": 2,
            "max_model_len": None,
            "engine_kwargs": {"vllm": {}, "sglang": {}},
            "multi_turn": {"enable": False, "max_assistant_turns": None, "tool_config_path": None, "format": "hermes"},
            "quantization_ignore": ["lm_head", "re:.*mlp.gate$"],
            "agent": {"num_workers": 8, "custom_async_server": {"path": None, "name": None}},
        },
    },
    "data": {
        "tokenizer": None,
        "train_files": "~/data/rlhf/gsm8k/train.parquet",
        "val_files": "~/data/rlhf/gsm8k/test.parquet",
        "prompt_key": "prompt",
        "max_prompt_length": 512,
        "max_response_length": 512,
        "train_batch_size": 1024,
        "val_batch_size": None,
        "shuffle": True,
        "truncation": "error",
        "tool_config_path": "${oc.select:actor_rollout_ref.rollout.multi_turn.tool_config_path,null}",
        "apply_chat_template_kwargs": {},
        "custom_cls": {"path": None, "name": None},
    },
    "critic": {
        "enable": None,
        "strategy": "fsdp",
        "optim": {"lr": 1.0e-05, "lr_warmup_steps_ratio": 0.0, "weight_decay": 0.01},
        "model": {"path": "~/models/deepseek-llm-7b-chat", "tokenizer_path": "${oc.select:actor_rollout_ref.model.path,null}"},
        "ppo_mini_batch_size": "${oc.select:actor_rollout_ref.actor.ppo_mini_batch_size,null}",
        "cliprange_value": 0.5,
    },
    "custom_reward_function": {"path": None, "name": "compute_score"},
    "reward_model": {
        "enable": False,
        "strategy": "fsdp",
        "model": {"input_tokenizer": "${actor_rollout_ref.model.path}", "path": "~/models/FsfairX-LLaMA3-RM-v0.1"},
        "micro_batch_size": None,
        "reward_manager": "naive",
        "launch_reward_fn_async": False,
    },
    "sandbox_fusion": {"url": None, "max_concurrent": 64, "memory_limit_mb": 1024},
    "reward": {"reward_manager": {"source": "register", "name": "naive"}, "num_workers": 8, "reward_kwargs": {}},
    "algorithm": {
        "_target_": "verl.trainer.config.AlgoConfig",
        "gamma": 1.0,
        "lam": 1.0,
        "adv_estimator": "gae",
        "norm_adv_by_std_in_grpo": True,
        "use_kl_in_reward": False,
        "kl_penalty": "kl",
        "kl_ctrl": {"type": "fixed", "kl_coef": 0.001, "horizon": 10000, "target_kl": 0.1},
    },
    "trainer": {
        "balance_batch": True,
        "total_epochs": 30,
        "total_training_steps": None,
        "project_name": "verl_examples",
        "experiment_name": "gsm8k",
        "logger": ["console", "wandb"],
        "nnodes": 1,
        "n_gpus_per_node": 8,
        "save_freq": -1,
        "resume_mode": "auto",
        "val_before_train": True,
        "checkpoint_base_dir": "checkpoints",
        "default_local_dir": "${trainer.checkpoint_base_dir}/${trainer.project_name}/${trainer.experiment_name}",
        "device": "cuda",
    },
    "global_profiler": {
        "_target_": "verl.utils.profiler.ProfilerConfig",
        "tool": None,
        "steps": None,
        "save_path": "outputs/profile",
        "global_tool_config": {"nsys": {"discrete": False, "controller_nsight_options": {"trace": "cuda,nvtx,cublas,ucx"}}},
    },
    "transfer_queue": {"enable": False},
    "ray_kwargs": {"ray_init": {"num_cpus": None}, "timeline_json_file": None},
}

VERL_SECTION_NAMES = list(_VERL_SECTIONS)
LONG_STRINGS = [_LONG_GRADER_TEXT, _LONG_QUERY_TEXT]


def _set_dotted(tree, dotted, value):
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[keys[-1]] = value


def agentjet_job_config(**overrides):
    """The dict of `AgentJetJob(...).config.to_dict()`; overrides are dotted paths under `ajet`
    (pass them as `**{"model.path": "m", "data.train_batch_size": 2}`)."""
    ajet = copy.deepcopy(_AJET_DEFAULTS)
    for dotted, value in overrides.items():
        _set_dotted(ajet, dotted, value)
    cfg = {"ajet": ajet}
    cfg.update(copy.deepcopy(_VERL_SECTIONS))
    cfg["defaults"] = ["verl_default", "ajet_default", "_self_"]
    cfg["hydra"] = {"searchpath": ["file://ajet/default_config", "file://ajet/default_config/verl"]}
    return cfg


def yaml_as_string(cfg):
    """Exactly what the client puts in `yaml_as_string`."""
    return yaml.safe_dump(cfg, sort_keys=False)
