"""Tensor and model names shared by the model repository, the client and the tests."""

# Entry point and pipeline steps (model_repository/<name>/).
ENSEMBLE = "ensemble"
PREPROCESSING = "preprocessing"
ORCHESTRATOR = "speculative_decoding"
DRAFT_MODEL = "draft_model"
TARGET_MODEL = "target_model"
POSTPROCESSING = "postprocessing"
SUPERVISOR = "supervisor"          # restarts draft_model / target_model when their process dies

# Request inputs (TensorRT-LLM / vLLM Triton conventions).
TEXT_INPUT = "text_input"
MAX_TOKENS = "max_tokens"
STREAM = "stream"
TEMPERATURE = "temperature"
TOP_P = "top_p"
TOP_K = "top_k"
SEED = "seed"
NUM_DRAFT_TOKENS = "num_draft_tokens"
STOP_WORDS = "stop_words"
PROPOSER = "proposer"              # draft, ngram or hybrid
# Logprobs of the target's distribution: each output token's (TensorRT-LLM's return_log_probs),
# with this many alternatives (OpenAI's top_logprobs, implies it), and the prompt's tokens'
# with this many alternatives (vLLM's prompt_logprobs; -1 or absent: none).
RETURN_LOG_PROBS = "return_log_probs"
TOP_LOGPROBS = "top_logprobs"
PROMPT_LOGPROBS = "prompt_logprobs"
# Structured output: the output follows this JSON schema (a grammar masks the target's choice).
JSON_SCHEMA = "json_schema"
# Whose earlier outputs suffix decoding may propose from (suffix_tenants "separate").
TENANT = "tenant"
# TensorRT-LLM-format inputs, as Triton's own OpenAI frontend sends them: accepted, and refused
# by name where they ask for what is not implemented.
RANDOM_SEED = "random_seed"        # seed, as TensorRT-LLM (and that frontend before 25.06) name it
EXCLUDE_INPUT_IN_OUTPUT = "exclude_input_in_output"   # true only: the output never echoes
RETURN_NUM_INPUT_TOKENS = "return_num_input_tokens"   # accepted; both counts always come back
RETURN_NUM_OUTPUT_TOKENS = "return_num_output_tokens"
FREQUENCY_PENALTY = "frequency_penalty"                # 0 only
PRESENCE_PENALTY = "presence_penalty"                  # 0 only
BAD_WORDS = "bad_words"                                # empty only

# Response outputs.
TEXT_OUTPUT = "text_output"
NUM_INPUT_TOKENS = "num_input_tokens"       # prompt tokens (the chat template's included)
NUM_OUTPUT_TOKENS = "num_output_tokens"
TOTAL_DRAFT_TOKENS = "total_draft_tokens"
TOTAL_ACCEPTED_DRAFT_TOKENS = "total_accepted_draft_tokens"
ACCEPTANCE_RATE = "acceptance_rate"
FINISH_REASON = "finish_reason"
NGRAM_DRAFT_TOKENS = "ngram_draft_tokens"          # of total_draft_tokens, prompt lookup's
NGRAM_ACCEPTED_TOKENS = "ngram_accepted_tokens"    # of total_accepted_draft_tokens
# Logprobs, where asked: each new token's [n] and its alternatives' ids and logprobs [n, top];
# the prompt's tokens after the first [L-1] (and [L-1, top]), in a request's first response.
OUTPUT_LOG_PROBS = "output_log_probs"
TOP_LOGPROB_IDS = "top_logprob_ids"
TOP_LOGPROB_VALUES = "top_logprob_values"
PROMPT_LOG_PROBS = "prompt_log_probs"
PROMPT_TOP_LOGPROB_IDS = "prompt_top_logprob_ids"
PROMPT_TOP_LOGPROB_VALUES = "prompt_top_logprob_values"
STATS_OUTPUTS = (NUM_INPUT_TOKENS, NUM_OUTPUT_TOKENS, TOTAL_DRAFT_TOKENS,
                 TOTAL_ACCEPTED_DRAFT_TOKENS, ACCEPTANCE_RATE, FINISH_REASON, NGRAM_DRAFT_TOKENS,
                 NGRAM_ACCEPTED_TOKENS)

# Every retryable error (no free slot within queue_timeout_s, a model restarting) has code
# UNAVAILABLE and a message that contains this: Triton 2.51's HTTP generate endpoints answer
# 400 for every error (docs/reliability.md), so HTTP clients can only tell it by the message.
UNAVAILABLE = "UNAVAILABLE:"

# Between pipeline steps.
INPUT_IDS = "input_ids"            # preprocessing -> orchestrator: prompt token ids
STOP_IDS = "stop_ids"              # preprocessing -> orchestrator: stop words, flattened ids
STOP_LENGTHS = "stop_lengths"      # preprocessing -> orchestrator: token count of each stop word
OUTPUT_IDS = "output_ids"          # orchestrator -> postprocessing; target -> orchestrator
PREFIX_LENGTH = "prefix_length"    # orchestrator -> postprocessing: ids already shown as text
IS_FINAL = "is_final"              # orchestrator -> postprocessing: flush held-back bytes
# orchestrator -> postprocessing: the generation this response belongs to, so that a step
# request the ensemble marks cancelled can cancel it (Triton does not cancel the running step).
GENERATION_ID = "generation_id"
# postprocessing -> orchestrator, with an empty input_ids: end that generation at its next round
CANCEL_GENERATION = "cancel_generation"

# Orchestrator -> draft_model / target_model (the packing is in specdec/serving/calls.py).
CALL = "call"                      # INT64 [12]: sequence id, start, k, top_k, seed, release,
                                   # next_k, drafts_in_target, next_by, tokens in the row,
                                   # logprobs, prompt_logprobs
SAMPLING = "sampling"              # FP32 [2]: temperature, top_p
TOKENS = "tokens"                  # committed tokens the model has not cached yet
DRAFT_TOKENS = "draft_tokens"      # draft -> orchestrator -> target
DRAFT_PROBS = "draft_probs"        # draft -> orchestrator -> target: q per drafted position
VERDICT = "verdict"                # target -> orchestrator: [status, accepted, ..., tokens...]
STATUS = "status"                  # supervisor: JSON {model: {up, restarts, last_restart_s, error}}
