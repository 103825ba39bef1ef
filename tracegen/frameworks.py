"""Framework profiles: which kernels a transformer layer is made of, as each training framework runs it.

A profile decides fusion, not FLOPs: the same layer costs the same GEMM FLOPs in every framework, but an
unfused framework launches more element-wise kernels and moves more bytes between them. The spec key
`framework:` picks one (default DEFAULT_FRAMEWORK); explicit keys (`attention:`, `precision:`) override
what the profile implies. Sources per profile are in the comments; docs/compute.md has the table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Framework:
    """How one framework builds a layer: fused or separate element-wise kernels."""

    name: str
    attention: str  # default attention kernel: "flash" (fused, causal) | "unfused" (materialized scores)
    bias_in_gemm: bool  # linear biases added in the GEMM epilogue (no kernel) vs a separate bias-add kernel
    fused_bias_act: bool  # MLP bias folded into the activation kernel (bias-GeLU / bias-SwiGLU)
    fused_swiglu: bool  # SwiGLU as one kernel (vs silu, then multiply: two kernels)
    fused_bias_dropout_add: bool  # bias + dropout + residual add as one kernel (vs dropout, then add)
    fused_rope: bool  # rotary embedding as one kernel over q and k (vs the unfused elementwise chain)
    transformer_engine: bool  # FP8 linears through Transformer Engine (casts, transposes, amax updates)
    # Fused attention kernel family on Hopper GPUs (tracegen/attention.py): "fa3" (a Hopper-native kernel)
    # or "fa2"; every profile runs FlashAttention-2 on Ampere.
    hopper_attention: str = "fa2"
    # BF16 gradients copied into an FP32 accumulation buffer after every micro-batch's backward (DeepSpeed's
    # BF16_Optimizer) rather than accumulated in FP32 by the weight-gradient GEMM (Megatron's main_grad).
    fp32_grad_copy_per_micro_batch: bool = False
    # Megatron-LM before Megatron-Core: its gradient accumulation, the copies around the DP all-reduce and
    # the optimizer's FP32 main-gradient copy as that year's code ran them (tracegen.grad_path); "" = the
    # Megatron-Core path (fused accumulation into the gradient buffer, no copies).
    grad_path: str = ""
    # Megatron's fused causal softmax (ScaledUpperTriangMaskedSoftmax) for sequences up to this length (0: no
    # such kernel): row i reads only its first i + 1 scores (the lower triangle) and writes the whole row;
    # backward reads the gradient and the probabilities of the triangle and writes the whole row
    # (megatron/fused_kernels/scaled_upper_triang_masked_softmax.h, `local_seq = blockIdx.x + 1`).
    causal_softmax_max_seq: int = 0
    # Megatron-LM's unfused attention on [s, b, np, hn] tensors (megatron/model/transformer.py,
    # ParallelAttention): the context is copied back to [s, b, h] (`permute(2, 0, 1, 3).contiguous()`) and
    # the Q/K/V gradients are concatenated into the fused projection's (backward of `torch.split`).
    attn_layout_copies: bool = False
    # A host thread per rank launches the kernels and waits at the framework's syncs (tracegen.host). Every
    # profile here is PyTorch eager, launched from Python. On by default for the two Megatron-LM years, whose
    # host syncs at every pipeline exchange (below); elsewhere only when a spec sets `host_dispatch: on` for
    # now: on by default it would add host nodes and ~30 us (the grad-norm read) to every generated
    # iteration, and the tests that pin generated node lists and iteration times to the nanosecond would all
    # need re-deriving (docs/tracegen.md, "Host dispatch").
    host_dispatch: bool = False
    # Megatron-LM 2021/2022's pipeline exchanges end with every request waited for and torch.cuda.
    # synchronize() ("to protect against race condition when using batch_isend_irecv()", _communicate in
    # megatron/p2p_communication.py of de7dc40f88 and d898a8991d): a host sync at each exchange.
    p2p_sync: bool = False
    # Megatron-LM 2021/2022's scatter/gather of pipeline sends (Narayanan et al. 2021, section 4.1;
    # _communicate in megatron/p2p_communication.py of de7dc40f88 and d898a8991d, on by default:
    # --no-scatter-gather-tensors-in-pipeline turns it off): each TP rank sends only its 1/TP chunk of the
    # activation or gradient (mpu.split_tensor_into_1d_equal_chunks) and the receiver, after the exchange's
    # synchronize, rebuilds the tensor with an all-gather over its TP group (mpu.gather_split_1d_tensor).
    # d898a8991d skips it under sequence parallelism (the tensor is already the rank's sequence slice) and
    # when TP does not divide the tensor's elements.
    pp_scatter_gather: bool = False
    # Megatron-LM's interleaved schedule with as many micro-batches as pipeline stages runs every pass of
    # every stage as warm-up, all forwards then all backwards (forward_backward_pipelining_with_interleaving:
    # `if get_num_microbatches() == pipeline_parallel_size: num_warmup_microbatches = num_microbatches;
    # all_warmup_microbatches = True`, megatron/schedules.py of de7dc40f88 and d898a8991d; the rule held from
    # dd88906264, 2020-12, until NVIDIA/Megatron-LM 4295be1a6c, 2024-11-01, which keeps only "warm-up >=
    # M*V"). Off: the per-stage min((P-k-1)*2 + (V-1)*P, M*V) alone (tracegen.schedule.interleaved).
    pp_all_warmup_at_m_eq_p: bool = False
    # DeepSpeed's PipelineEngine (deepspeed/runtime/pipe/, read at microsoft/DeepSpeed v0.6.0 a32e9b3376 and
    # v0.7.0 5fe9d61065, and at olruwase/elastic-ckpt-refresh e4a5a46489, the branch BLOOM-176B ran
    # (bigscience tr11-176B-ml README; the same at v0.5.4 bc7778ea5b; v0.9.0 and later issue SendGrad before
    # RecvActivation and RecvGrad before SendActivation, b528f50e3): every transfer is a blocking p2p.send / p2p.recv
    # (dist.send / dist.recv, async_op refused; before v0.5.4 dist.broadcast over a two-rank group), which
    # waits for the kernels before it and holds the kernels after it (on the compute stream's order), and
    # TrainSchedule (schedule.py) issues a forward slot as RecvActivation, SendGrad of the previous slot's
    # backward, ForwardPass, and a backward slot as SendActivation of the previous forward, RecvGrad,
    # BackwardPass: a backward's gradient leaves after the next forward's input arrived. Under TP > 1
    # (is_pipe_partitioned = is_grad_partitioned = is_model_parallel) both tensors travel as the rank's
    # 1/TP part (the scatter/gather above, pp_scatter_gather), and _exec_backward_pass all-gathers the
    # stage's own output again (part_output.full()) before the received gradient's all-gather.
    # Not modelled: ReduceTiedGrads and ReduceGrads run after the last slot (no overlap with the backward).
    deepspeed_pipe: bool = False
    # DeepSpeed's pipeline engine before the gradient was partitioned too: `self.is_grad_partitioned = False`
    # in PipelineEngine.__init__ (deepspeed/runtime/pipe/engine.py of EleutherAI/DeeperSpeed eb7f5cff36, the
    # commit gpt-neox c560814b's requirements/requirements.txt pins, and of microsoft/DeepSpeed v0.5.0
    # f28432441b): _exec_send_grads sends `inputs[0].grad` whole and _exec_recv_grads receives it into a
    # buffer of the full output's shape, no all-gather after it; the activation still travels as the
    # rank's 1/TP part (is_pipe_partitioned) and _exec_recv_grads still rebuilds the stage's own output
    # (part_output.full()) before the receive. Only with deepspeed_pipe and pp_scatter_gather.
    pp_grad_whole: bool = False
    # Megatron-LM 2021/2022's timers synchronize the device at every start and stop (_Timer.start/stop run
    # torch.cuda.synchronize(), megatron/global_vars.py of de7dc40f88 and d898a8991d), and the training
    # loop times every forward step ('forward-compute', schedules.py forward_step), the batch it loads
    # ('batch-generator', pretrain_gpt.py forward_step; get_batch's mpu.broadcast_data copies the sizes it
    # broadcast to the host, `sizes_cuda.cpu()` in mpu/data.py), every backward step ('backward-compute')
    # and every pipeline exchange ('forward-recv', ..., 'forward-backward-send-forward-backward-recv',
    # p2p_communication.py): host syncs at each pass and exchange (tracegen.workload TIMER_SYNCS).
    step_timers: bool = False
    # GPT's word embeddings are always tied to the output layer (GPTModel: share_word_embeddings, no switch
    # in the 2021/2022 code; later Megatron and Megatron-DeepSpeed add --untie-embeddings-and-output-weights,
    # so there the model decides: ModelArch.tied, the spec's tie_embeddings). A tied model on one stage holds
    # one matrix; with pipeline parallelism the last stage holds a copy and train_step all-reduces the
    # copy's and the original's gradient (`word_embeddings_weight.main_grad`, after the DP all-reduce,
    # before optimizer.step) over the embedding group, each first-stage rank and its last-stage peer of the
    # same TP position (megatron/training.py train_step, 'backward-embedding-all-reduce', de7dc40f88 and
    # d898a8991d; mpu/initialize.py builds the group; Megatron-Core: finalize_model_grads.py
    # _allreduce_word_embedding_grads; DeepSpeed's pipeline engine: _exec_reduce_tied_grads).
    always_tied: bool = False
    # The backward of a column-parallel linear (QKV, MLP up/gate, LM head) as one autograd function runs it
    # (Megatron's LinearWithGradAccumulationAndAsyncCommunication.backward, TE's _LayerNormLinear.backward),
    # its collectives on the NCCL stream while the GEMMs run ("we rely on CUDA_DEVICE_MAX_CONNECTIONS=1"):
    # - sp_dgrad_overlap: under sequence parallelism the forward saved only the rank's input shard, so the
    #   backward all-gathers it again asynchronously under the input-gradient (dgrad) GEMM, waits for it,
    #   launches the dgrad's ReduceScatter asynchronously, runs the weight-gradient (wgrad) GEMM under it and
    #   waits at the end;
    # - async_dgrad_allreduce: without sequence parallelism the dgrad's AllReduce runs asynchronously under
    #   the wgrad GEMM (`async_tensor_model_parallel_allreduce`).
    # Off: the whole backward GEMM, then the collective (Megatron-LM 2021's copy_to_tensor_model_parallel_
    # region, whose backward all-reduces after autograd has run both GEMMs), no re-gather.
    sp_dgrad_overlap: bool = False
    async_dgrad_allreduce: bool = False
    # The vocab-parallel embedding's output under sequence parallelism. True: its partial rows are
    # reduce-scattered straight into the rank's sequence slice (Megatron-Core core_r0.8.0 on:
    # VocabParallelEmbedding.forward `reduce_scatter_to_sequence_parallel_region` when LanguageModelEmbedding
    # sets reduce_scatter_embeddings, i.e. without a learned position table and token types, megatron/core/
    # tensor_parallel/layers.py and models/common/embeddings/language_model_embedding.py). False: all-reduced
    # whole over TP (reduce_from_tensor_model_parallel_region), the position table added on every rank, then
    # split (scatter_to_sequence_parallel_region: a view, no collective); its backward is the same AllGather
    # (Megatron-Core core_v0.5.0-core_v0.7.0, Megatron-LM 2022 d898a8991d megatron/model/language_model.py,
    # Megatron-DeepSpeed f4157bea69). With learned positions every profile takes the all-reduce.
    embedding_reduce_scatter: bool = False
    # The position encoding a model gets when the spec does not name one (models.POSITION_EMBEDDINGS; "":
    # the model family's, ModelArch.positions).
    position_embedding: str = ""
    # Eager PyTorch's element-wise kernels, one per operator (tracegen/ops.py, EAGER_RMSNORM and
    # COMPLEX_ROPE): RMSNorm as a composite in FP32 ("torch": torch.nn.RMSNorm's; "torchtitan-2024":
    # torchtitan's own norms.py RMSNorm before 2025-03-19; "fused": one kernel each way, every fused
    # profile's), RoPE as the view_as_complex chain, and no dropout kernels (the model has no dropout: the
    # residual add alone, no embedding dropout). The spec's `rmsnorm_impl` replaces `rmsnorm`.
    rmsnorm: str = "fused"
    complex_rope: bool = False
    dropout: bool = True
    # Attention-probability dropout rate (Megatron-LM's --attention-dropout, default 0.1: megatron/training/
    # arguments.py of core_v0.6.0; Megatron-Core's TransformerConfig.attention_dropout = 0.1, core_r0.8.0
    # megatron/core/transformer/transformer_config.py). Inside a fused attention kernel p > 0 costs its
    # published dropout / no-dropout ratio (tracegen.attention.dropout_ratio); unfused attention runs its own
    # `attn_dropout` op at p > 0 and none at p = 0 (F.dropout with p = 0 returns its input). Independent of
    # `dropout` (the hidden dropout), as Megatron's two flags are. The spec's `attention_dropout` replaces it.
    attention_dropout: float = 0.1
    # The loss (tracegen.ops.XENT): "megatron" (Megatron's vocab-parallel cross-entropy on an FP32 copy of
    # the logits) | "eager" (F.cross_entropy on FP32 logits in eager PyTorch: the cast, log_softmax, nll_loss
    # and their backward) | "fused" (one softmax cross-entropy kernel each way on the 16-bit logits:
    # flash-attn's CrossEntropyLoss on apex xentropy) | "te" (Transformer Engine's Triton parallel
    # cross-entropy on the 16-bit logits, Megatron-Core's cross_entropy_fusion_impl "te"). The spec's
    # `loss_impl` replaces it (megatron-core profiles).
    loss: str = "megatron"
    # FSDP2 keeps the model's last transformer block gathered from its forward to its backward
    # (fully_shard(..., reshard_after_forward=False) on it; tracegen.workload _root_kept).
    fsdp_keep_last_block: bool = False
    # FSDP2's per-parameter sharding copies (fully_shard; torch/distributed/_composable/fsdp/_fsdp_collectives.py
    # and _fsdp_param_group.py of pytorch/pytorch 01d66d21f3 and 012c62d620, the torch-2.4 dev builds'):
    # - the all-gather's copy-out: wait_for_unshard runs foreach_all_gather_copy_out on the current (compute)
    #   stream after waiting for the all-gather's event, `torch.split_with_sizes_copy(all_gather_output, ...,
    #   dim=1, out=...)` from the gathered flat buffer into each unsharded parameter: read and write the
    #   gathered unit once in the parameter dtype, before the unit's first op (every visit that gathers);
    # - the reduce-scatter's copy-in: foreach_reduce_scatter makes the reduce-scatter stream wait for the
    #   compute stream, copies the unsharded gradients into the flat reduce-scatter input in the reduce dtype
    #   (`torch.cat(grad_views, dim=-1, out=reduce_scatter_input.view(world_size, -1))`: read the model dtype,
    #   write the reduce dtype per element) and the compute stream then waits for that copy
    #   (`current_stream.wait_event(copy_in_event)`, "Only after the copy-in finishes can we free the
    #   gradients"); on that stream the copy follows the previous unit's ReduceScatter, whose synchronous call
    #   makes the stream wait for it. An FP32 reduce averages in NCCL (ReduceOp.AVG, no divide kernels:
    #   pytorch/pytorch PR 120919, 2024-03); pre/post-divide kernels (16-bit reduce before PR 123362,
    #   2024-04) are not modelled. tracegen.workload _fsdp_copy_out and fsdp_reduce.
    fsdp2_copies: bool = False
    # The optimizer is torch.optim.AdamW(foreach=True) stepping the FP32 parameters themselves (torchtitan
    # 157a12c56 train.py build_optimizer; FSDP2's sharded parameters stay FP32, its MixedPrecisionPolicy
    # casting them at each gather): its eight foreach calls (tracegen.ops ADAMW_FOREACH_BYTES) in place of
    # Megatron's fused Adam, no master-weight copy, and `optimizer.zero_grad()` sets the gradients to None
    # (torch.optim.Optimizer.zero_grad's set_to_none=True, torch 2.x): no zeroing kernel.
    torch_adamw: bool = False
    # GQA's keys and values expanded to the query heads by a copy before flash attention (torchtitan
    # 157a12c56 torchtitan/models/llama/model.py `repeat_kv`: `x[:, :, :, None, :].expand(bs, slen,
    # n_kv_heads, n_rep, head_dim).reshape(...)`, which materializes; SDPA then gets them contiguous in
    # [b, s, heads, d], as it returns its output, so `output.transpose(1, 2).contiguous()` copies nothing):
    # tracegen.ops attention_steps `attn_kv_repeat`, only where heads > kv_heads.
    repeat_kv: bool = False
    # SwiGLU's gate and up projections as two GEMMs (InternLM's FeedForward w1, w2: `w3(F.silu(w1(x)) *
    # w2(x))`) rather than one [h, 2f] GEMM split by torch.chunk: the unfused SwiGLU's backward then has no
    # concatenation of the two halves' gradients (SWIGLU_UNFUSED_SPLIT).
    swiglu_split_gemms: bool = False
    # The norms run on an FP32 copy of the residual stream (InternLM's `self.norm1(_residual.float())`,
    # internlm/model/modeling_internlm.py of 4a3d156, into apex's MixedFusedRMSNorm, which writes the
    # weight's dtype): a cast kernel before each norm (read dtype, write 4 B) and the norm reading 4 B;
    # backward the norm writes an FP32 input gradient and the cast's backward casts it back (read 4, write
    # dtype) (FP32_NORM_INPUT).
    fp32_norm_input: bool = False
    # Megatron-LM's legacy ParallelAttention in front of flash-attn (megatron/model/transformer.py, as
    # FlagScale ed55532 carries it): q, k and v are torch.split views of the fused projection's [s, b, ...]
    # output; k and v are expanded to the query heads by `repeat_interleave` (unconditionally: an
    # index_select, whose backward is zeros + index_add_);
    # q, k, v are copied to [b, s, np, hn] by `rearrange(x, 's b ... -> b s ...').contiguous()` (a copy of
    # each: FlagScale's --rotary-interleaved-patch leaves them non-contiguous for any batch); the backward
    # sums repeat_interleave's gradient and concatenates the split's three gradients into the projection's
    # output gradient; the context's `rearrange(..., 'b s h d -> s b (h d)').contiguous()` copies it when
    # b > 1 (tracegen.ops.attention_steps, `attn_qkv_copy`).
    flash_layout_copies: bool = False
    # Unfused RoPE that slices q and k into rotated and passed parts and concatenates them back (Megatron-LM
    # 2023's apply_rotary_pos_emb: tracegen.ops.ROPE_SLICE_CAT).
    rope_slice_cat: bool = False
    # Weight gradients accumulated over micro-batches by autograd in the parameters' own `.grad` (dtype):
    # from the second micro-batch on, AccumulateGrad's `variable_grad += new_grad` per parameter tensor
    # (read 2, write 1; torch/csrc/autograd/functions/accumulate_grad.h), rather than Megatron's fused
    # accumulation into an FP32 buffer (tracegen.workload accumulate_grads); the optimizer sets them to None
    # after the step (no zeroing kernel).
    autograd_grad_accum: bool = False
    # A sharded optimizer (`distributed_optimizer`) whose gradient buckets are all-reduced whole, each rank
    # then updating its shard, rather than reduce-scattered: InternLM 4a3d156's hybrid ZeRO attaches its
    # reduction hooks with reduce_rank None (hybrid_zero_optim.py _attach_reduction_hook), and reduce_tensor
    # with dst_rank None calls dist.all_reduce (internlm/solver/optimizer/utils.py).
    sharded_grad_allreduce: bool = False
    # The vocabulary the embedding, LM head and loss run on, rounded up to a multiple of this x TP (0: the
    # model's vocabulary as given). Megatron pads it in every tokenizer's build (`_vocab_size_with_padding`:
    # `multiple = make_vocab_size_divisible_by * tensor_model_parallel_size`, rounded up; megatron/training/
    # tokenizer/tokenizer.py of NVIDIA/Megatron-LM 00ee96672c, megatron/tokenizer/tokenizer.py in the 2021/
    # 2022 trees and in Megatron-DeepSpeed), --make-vocab-size-divisible-by default 128 (arguments.py); NeMo
    # the same (nemo/collections/nlp/models/language_modeling/megatron_base_model.py `_build_vocab`,
    # make_vocab_size_divisible_by default 128 x tensor_model_parallel_size). torchtitan builds nn.Embedding
    # and the output nn.Linear on the tokenizer's vocab_size unpadded (torchtitan/models/llama3/model/
    # model.py), so its profile keeps 0. The spec's `make_vocab_size_divisible_by` overrides it.
    vocab_divisible_by: int = 0
    # The word embedding's weight gradient as the framework's embedding lookup runs it backward
    # (tracegen.ops.embedding_steps): "" = the scatter-add of the token rows alone (read the gradient, read
    # and write the row); "index_put" = Megatron-Core core_v0.5.0-core_v0.7.0's `self.weight[masked_input]`
    # (VocabParallelEmbedding.forward, megatron/core/tensor_parallel/layers.py), whose backward is
    # index_backward's `zeros_like(self).index_put_(indices, grad, accumulate=True)`: a zero-filled
    # vocab/TP x hidden gradient in the model dtype, then the same scatter-add; "dense" = core_r0.8.0 on,
    # F.embedding (deterministic_mode off, its default), whose embedding_dense_backward (aten/src/ATen/
    # native/cuda/EmbeddingBackwardKernel.cu, embedding_backward_cuda_kernel) zero-fills the gradient, sums
    # the token rows' gradient into FP32 partial segments (compute_grad_weight: read dtype, write 4 B per
    # element) and scatters them into the rows (sum_and_scatter: read 4 B, write dtype).
    embedding_bwd: str = ""
    # Megatron-Core's DDP gradient hook on every parameter (DistributedDataParallel._make_param_hook,
    # megatron/core/distributed/distributed_data_parallel.py of core_v0.6.0 and core_r0.8.0): a parameter
    # whose gradient the weight-gradient GEMM did not already accumulate (`grad_added_to_main_grad` unset:
    # the word embedding and a learned position table, not being fused linears; in every layer the norms'
    # gains and biases and the linears' biases, Transformer Engine 1.8 marking only the weights it
    # accumulates with fuse_wgrad_accumulation, transformer_engine/pytorch/module/layernorm_linear.py and
    # linear.py; the final norm's) gets `param.main_grad.add_(param.grad.data)` every micro-batch, one
    # kernel per tensor: read the buffer's dtype, read the model dtype, write the buffer's dtype per
    # parameter (tracegen.ops main_grad_hook_adds). A tied output layer on the same stage (language_module.py
    # sets `zero_out_wgrad` on the shared weight) returns a zero-filled vocab/TP x hidden weight gradient
    # (layers.py LinearWithGradAccumulationAndAsyncCommunication.backward, `torch.zeros(...)`: write dtype)
    # that autograd sums with the embedding's (read, read, write dtype) before the hook adds the sum.
    main_grad_hook: bool = False
    # Megatron-FSDP's gradient hook into a sharded gradient buffer (sharding: megatron-fsdp with
    # optim_grads or optim_grads_params; megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py
    # _grad_acc at 0d8e0714cd): the unit's temporary main_grad bucket is fetched and each such gradient
    # copied into it, `param.main_grad.copy_(param.grad)` (read the model dtype, write the buffer's dtype),
    # instead of main_grad_hook's add (the unsharded buffer of `optim` adds, as Megatron-Core DDP).
    main_grad_copy: bool = False
    # Megatron-Core's Bucket.start_grad_sync (megatron/core/distributed/param_and_grad_buffer.py), once per
    # gradient bucket before its DP collective: `self.grad_data *= self.gradient_scaling_factor` (1 / DP;
    # read and write the bucket): "always" (core_v0.6.0: unconditionally, DP 1 included) | "not_one"
    # (core_v0.7.0 on: only `if self.gradient_scaling_factor != 1.0`, i.e. DP > 1 without
    # average_in_collective) | "" (not run); and, where check_for_nan_in_grad, `norm =
    # self.grad_data.norm(p=2)` first (read the bucket; its `assert not norm.isnan()` syncs the host, not
    # modelled). The spec's `check_for_nan_in_grad` replaces the profile's default (Megatron-LM's
    # --check-for-nan-in-loss-and-grad is on unless --no-check-for-nan-in-loss-and-grad: megatron/training/
    # arguments.py of core_v0.6.0 and core_r0.8.0; NeMo 24.07 passes `optim.check_for_nan_in_grad`, default
    # False: megatron_gpt_model.py of NVIDIA/NeMo f2e3232).
    bucket_scale: str = ""
    check_for_nan_in_grad: bool = False
    # Megatron-Core's DDP splits a model chunk's gradients into buckets of bucket_size (xsim's
    # `dp_bucket_bytes`) only on the first pipeline stage and only for model chunk 0: every other chunk is
    # one bucket (NVIDIA/Megatron-LM 5d745a79cd, 2023-09-25, "Enable grad overlap with interleaved PP
    # schedule", through core_v0.15.0: distributed_data_parallel.py sets bucket_size = None `if
    # pipeline_model_parallel_rank > 0` or `if disable_bucketing`, and training.py get_model passes
    # `disable_bucketing=(model_chunk_idx > 0)`, "Turn off bucketing for model_chunk 2 onwards"; NeMo 2.x
    # megatron_parallel.py and Megatron-Bridge wrap their chunks the same way). Not where the spec's
    # `dist_optimizer_impl: apex` says Apex's DistributedFusedAdam reduces the gradients instead.
    first_chunk_buckets: bool = False
    # Megatron-Core's q, k and v are split views of the QKV projection's output (get_query_key_value_tensors
    # in megatron/core/transformer/attention.py of core_v0.6.0 and core_r0.8.0: Transformer Engine's
    # SplitAlongDim); its backward (_SplitAlongDim.backward, transformer_engine/pytorch/attention.py of
    # v1.8) returns the three gradients as one view only when they already lie side by side in one buffer,
    # else torch.cat. Under RoPE dq and dk are the rotary backward's own new tensors, so the cat runs on
    # every backend: `qkv_grad_cat` (tracegen.ops._qkv_split_cat).
    qkv_split_cat: bool = False
    # The batch's way onto the GPU each micro-batch (tracegen.batch_input, BATCH_INPUTS): "megatron" for
    # Megatron-LM's get_batch_on_this_tp_rank (TP rank 0 copies the batch host to device, the mask included,
    # and broadcasts it over TP; megatron/training/utils.py of core_v0.6.0 to core_r0.12.0) | "" (not
    # generated). The spec's `batch_input` replaces it (`megatron-no-mask`, `nemo`, `none`). On in
    # megatron-core-0.7; megatron-core runs the same code but is the default profile, whose generated node
    # lists and times many tests pin to the nanosecond: off there until they are re-derived (as
    # host_dispatch, docs/tracegen.md "Batch input"), a spec's `batch_input: megatron` turns it on.
    batch_input: str = ""
    # The embedding output's layout change [b, s, h] -> [s, b, h], `embeddings.transpose(0, 1).contiguous()`:
    # a copy when the micro-batch has more than one sequence (with one the transposed view is already
    # contiguous). Megatron-Core core_v0.6.0 and core_r0.8.0 LanguageModelEmbedding.forward (core_r0.8.0's
    # VocabParallelEmbedding.forward does the same before its reduce-scatter, megatron/core/tensor_parallel/
    # layers.py), Megatron-LM d898a8991d Embedding.forward (megatron/model/language_model.py). Backward the
    # gradient arrives transposed, and each embedding lookup's dense backward copies it contiguous first
    # (aten/src/ATen/native/cuda/Embedding.cu embedding_dense_backward_cuda: `grad_.contiguous()`): the word
    # table's (F.embedding, embedding_bwd "dense" or "") and a learned position table's (torch.nn.Embedding).
    embedding_transpose: bool = False
    # Under sequence parallelism with the embedding output all-reduced, then split (a view), Megatron-Core
    # clones the rank's slice "to facilitate GC" (LanguageModelEmbedding.forward, `if self.config.
    # clone_scatter_output_in_embedding: embeddings = embeddings.clone()`, --no-clone-scatter-output-in-
    # embedding unset: megatron/training/arguments.py of core_v0.6.0 and core_r0.8.0): read and write the
    # slice forward; the clone's backward passes the gradient through.
    embedding_sp_clone: bool = False


# Megatron-LM as run by Narayanan et al. 2021 (SC'21, arXiv:2104.04473, section 4.2) and Korthikanti et
# al. 2022: unfused attention (QK^T GEMM, fused scale-mask-softmax kernel, attention dropout, attention
# over V); bias + GeLU and bias + dropout + add fused with PyTorch JIT (section 4.2: "fused kernels for
# a sequence of element-wise operations (bias + GeLU and bias + dropout + add)"); the QKV projection's
# bias added by torch.nn.functional.linear outside the GEMM (ColumnParallelLinear, skip_bias_add=False);
# no FP8, no RoPE or SwiGLU in that code (if a model asks for them they run unfused). Its gradient path
# is the code of Narayanan et al.'s examples/sc21 scripts (Megatron-LM de7dc40f88): no fused gradient
# accumulation, FP16 gradients accumulated by autograd and coalesced around the all-reduce.
# The fused causal softmax serves 16 < s <= 2048 in that code (megatron/model/fused_softmax.py,
# custom_kernel_constraint), 16 < s <= 4096 in 2022 (is_kernel_available).
def _unfused_layer(name: str, bias_in_gemm: bool, fused_rope: bool = False, **rest: object) -> Framework:
    """A profile outside Megatron's fused kernels: flash attention (the flash-attn 2 package, FA2 on Hopper
    too), every element-wise step its own kernel (RoPE fused only where `fused_rope`), no Transformer
    Engine; `rest` sets the other fields."""
    return Framework(name, "flash", bias_in_gemm, False, False, False, fused_rope, False, "fa2", **rest)  # type: ignore[arg-type]


_MEGATRON_2021 = Framework(
    "megatron-2021",
    "unfused",
    False,
    True,
    False,
    True,
    False,
    False,
    grad_path="megatron-2021",
    causal_softmax_max_seq=2048,
    attn_layout_copies=True,
    host_dispatch=True,
    p2p_sync=True,
    pp_scatter_gather=True,
    pp_all_warmup_at_m_eq_p=True,
    step_timers=True,
    always_tied=True,
    vocab_divisible_by=128,
    # Megatron-LM 2021/2022's Embedding always builds the learned position table (megatron/model/
    # language_model.py of de7dc40f88 and d898a8991d: torch.nn.Embedding(max_sequence_length, hidden), no
    # switch; --max-position-embeddings is a required argument).
    position_embedding="learned",
)

# Megatron-Core with Transformer Engine (comments at its entry below).
_MEGATRON_CORE = Framework(
    "megatron-core",
    "flash",
    True,
    True,
    True,
    True,
    True,
    True,
    "cudnn",
    sp_dgrad_overlap=True,
    async_dgrad_allreduce=True,
    embedding_reduce_scatter=True,
    vocab_divisible_by=128,
    embedding_bwd="dense",
    main_grad_hook=True,
    bucket_scale="not_one",
    check_for_nan_in_grad=True,
    first_chunk_buckets=True,
    qkv_split_cat=True,
    embedding_transpose=True,
    embedding_sp_clone=True,
)

FRAMEWORKS: dict[str, Framework] = {
    # de7dc40f88's ColumnParallelLinear (megatron/mpu/layers.py) has no asynchronous communication and no
    # sequence parallelism: copy_to_tensor_model_parallel_region all-reduces the input gradient after the
    # layer's backward (sp_dgrad_overlap / async_dgrad_allreduce off).
    "megatron-2021": _MEGATRON_2021,
    # The same layer as Korthikanti et al. 2022 ran it (Megatron-LM d898a8991d, 2022-05-25: the kernels of
    # megatron-2021 plus sequence parallelism and selective recompute): contiguous gradient buffers and, for
    # FP32 accumulation (bf16), the weight-gradient GEMM accumulating into the buffer (tracegen.grad_path).
    # Its column-parallel linears and the LM head (parallel_lm_logits) run LinearWithGradAccumulationAnd-
    # AsyncCommunication (megatron/mpu/layers.py): the SP re-gather under dgrad and ReduceScatter under
    # wgrad; without SP the asynchronous AllReduce (`--no-async-tensor-model-parallel-allreduce` unset: on
    # by default, arguments.py; switched off only under --sequence-parallel, which takes the SP path).
    "megatron-2022": replace(
        _MEGATRON_2021,
        name="megatron-2022",
        grad_path="megatron-2022",
        causal_softmax_max_seq=4096,
        sp_dgrad_overlap=True,
        async_dgrad_allreduce=True,
        embedding_transpose=True,
    ),
    # Megatron-Core with Transformer Engine (what NeMo and Megatron-LM run today): TE linear layers add
    # their bias in the cuBLASLt epilogue; fused bias-GeLU / bias-SwiGLU (megatron/core/fusions/
    # fused_bias_gelu.py, fused_bias_swiglu.py); fused bias-dropout-add (fused_bias_dropout.py); fused RoPE
    # (--apply-rope-fusion, on by default); flash attention with a causal mask (TE DotProductAttention); FP8
    # linears through TE when precision is fp8. On Hopper TE's DotProductAttention picks cuDNN's fused
    # attention over flash-attn ("Disabling FlashAttention to give FusedAttention preference on Hopper+ for
    # performance reasons", transformer_engine/pytorch/attention utils get_attention_backend), a Hopper-native
    # kernel timed at FlashAttention-3's published rates (FlashAttention-3, section 4.1: FA3 matches or
    # beats cuDNN from 1k tokens on, so these rates are cuDNN's upper bound).
    # TE's _LayerNormLinear.backward (QKV, fc1; transformer_engine/pytorch/module/layernorm_linear.py of
    # v1.8, without userbuffers) gathers ln_out again (async_op=True, "Overlap input AG with dgrad"), then
    # "Overlap dgrad-RS/AR with wgrad": the ReduceScatter under SP, else the AllReduce, asynchronously, and
    # waits after the wgrad GEMM; the LM head is Megatron-Core's ColumnParallelLinear (megatron/core/
    # tensor_parallel/layers.py: the same order, allreduce_dgrad whenever TP > 1 without SP).
    "megatron-core": _MEGATRON_CORE,
    # Megatron-Core core_v0.5.0 to core_v0.7.0 (e.g. FlagPerf's Llama 3 8B case, core_v0.6.0): the layer of
    # megatron-core; under sequence parallelism the embedding output is all-reduced whole, then split
    # (embedding_reduce_scatter off: VocabParallelEmbedding.forward of core_v0.6.0 and core_v0.7.0 ends with
    # reduce_from_tensor_model_parallel_region, and LanguageModelEmbedding scatters to the sequence-parallel
    # region after it; the reduce-scatter arrives in core_r0.8.0).
    # Its embedding is `self.weight[masked_input]` (embedding_bwd "index_put") and its buckets are scaled by
    # 1 / DP unconditionally (core_v0.6.0's start_grad_sync; core_v0.7.0 skips a factor of 1, at DP 1).
    "megatron-core-0.7": replace(
        _MEGATRON_CORE,
        name="megatron-core-0.7",
        embedding_reduce_scatter=False,
        embedding_bwd="index_put",
        bucket_scale="always",
        batch_input="megatron",
    ),
    # Megatron-DeepSpeed (the fork behind BLOOM and many Llama launch scripts): flash attention
    # (--use-flash-attn, causal), SwiGLU as F.silu(x[0]) * x[1] and RoPE as apply_rotary_pos_emb's
    # elementwise chain (both unfused), biases added by separate kernels, dropout and residual add as
    # separate kernels; no Transformer Engine. Its flash attention is the flash-attn 2 package (FA2 on
    # Hopper too).
    # Under bf16 with ZeRO stage 0 DeepSpeed runs its BF16_Optimizer, whose pipeline engine calls
    # update_hp_grads() after every micro-batch's backward (deepspeed/runtime/pipe/engine.py
    # _exec_backward_pass; deepspeed/runtime/bf16_optimizer.py: "we copy/accumulate to the high-precision
    # grads now to prevent accumulating in the bf16 grads after successive backward() calls").
    # Its LinearWithGradAccumulationAndAsyncCommunication (megatron/core/tensor_parallel/layers.py,
    # microsoft/Megatron-DeepSpeed f4157bea69) runs the SP re-gather and overlapped ReduceScatter as
    # Megatron's, but arguments.py turns async_tensor_model_parallel_allreduce off under --deepspeed ("DeepSpeed
    # seems to be incompatible with async_tensor_model_parallel_allreduce"): without SP the input gradient is
    # all-reduced by copy_to_tensor_model_parallel_region after the whole backward.
    # Its unfused attention (BLOOM's path: no --use-flash-attn) is Megatron-LM's of 2021 in both forks
    # (megatron/model/transformer.py of bigscience-workshop/Megatron-DeepSpeed affff3d2, 2022-03-17, the day
    # before BLOOM's iteration 12695, and microsoft/Megatron-DeepSpeed f4157bea69): the Q/K/V split of the
    # fused projection (split_tensor_along_last_dim / torch.split: a cat backward), the context's
    # permute(2, 0, 1, 3).contiguous() (attn_layout_copies), and GPTModelPipe's causal self-attention mask
    # type, for which FusedScaleMaskSoftmax runs ScaledUpperTriangMaskedSoftmax when 16 < sk <= 4096
    # (megatron/model/fused_softmax.py is_kernel_available, both forks; BLOOM's slurm script sets
    # --abort-on-unmet-fused-kernel-constraints).
    "megatron-deepspeed": _unfused_layer(
        "megatron-deepspeed",
        bias_in_gemm=False,
        fp32_grad_copy_per_micro_batch=True,
        causal_softmax_max_seq=4096,
        attn_layout_copies=True,
        sp_dgrad_overlap=True,
        vocab_divisible_by=128,
        pp_scatter_gather=True,
        deepspeed_pipe=True,
    ),
    # torchtitan in eager mode (`[compile] enable = false`, its default: torchtitan/config/job_config.py
    # Compile.enable), read from pytorch/torchtitan e38d7abe0f (2026-02-09) torchtitan/models/llama3/model/
    # model.py: nn.RMSNorm for the attention, FFN and final norms, which PyTorch runs as its composite
    # rms_norm (aten/src/ATen/native/layer_norm.cpp rms_norm_symint before CUDA inputs went to the fused
    # _fused_rms_norm: input.to(float), pow(2).mean(-1).add_(eps).rsqrt(), mul, mul by the weight, type_as;
    # EAGER_RMSNORM); apply_rotary_emb's xq.float() / view_as_complex / complex multiply by
    # freqs_cis / view_as_real / type_as on q and k (COMPLEX_ROPE); FeedForward.forward
    # `self.w2(F.silu(self.w1(x)) * self.w3(x))` (unfused SwiGLU); TransformerBlock.forward `h = x +
    # attention(...)`, `out = h + feed_forward(...)` (residual adds, no dropout anywhere in the model);
    # bias-free nn.Linear (bias_in_gemm: nothing to add); attention through F.scaled_dot_product_attention (`attn_type: sdpa`), whose CUDA
    # backend on Ampere and Hopper is PyTorch's bundled FlashAttention-2 (causal); no Transformer Engine
    # (torchtitan's FP8 is torchao's, not modelled here). An eager-PyTorch Llama trainer written the same
    # way (nn.RMSNorm, complex RoPE, F.silu(w1) * w3, no dropout) gets the same layer.
    # The loss (torchtitan 157a12c56 train.py `loss_fn`: F.cross_entropy(pred.flatten(0, 1), ...) on the
    # model's `self.output(h).float()`; 9dec370ad moves the .float() into loss_fn): the FP32 cast, then
    # log_softmax and nll_loss as eager PyTorch runs them (loss "eager"). FSDP2 (parallelize_llama.py at
    # 157a12c56 and 9dec370ad): `reshard_after_forward = layer_id < len(model.layers) - 1`, "as an
    # optimization, do not reshard after forward for the last transformer block" (fsdp_keep_last_block;
    # under pipeline parallelism 9dec370ad keeps every block, not modelled). SDPA on the H100 at the Dec 2024
    # benchmark: FlashAttention-2, cuDNN attention being opt-in since pytorch/pytorch PR 138522 (2024-10-22;
    # issue 142132 shows the 2024-12-04 nightly not choosing it) until torchtitan PR 1000 (2025-03-20).
    "torchtitan": _unfused_layer(
        "torchtitan",
        bias_in_gemm=True,
        rmsnorm="torch",
        complex_rope=True,
        dropout=False,
        attention_dropout=0.0,
        loss="eager",
        fsdp_keep_last_block=True,
        fsdp2_copies=True,
        torch_adamw=True,
        repeat_kv=True,
    ),
    # FlagScale ed55532 (FlagOpen/FlagScale, 2023-10-23: Megatron-LM's legacy GPT model of 2023,
    # megatron/model/transformer.py, what BAAI FlagPerf's Aquila2-7B case runs): ParallelMLP's SwiGLU is
    # `x = torch.chunk(x, 2, dim=-1); return F.silu(x[0]) * x[1]` (unfused, one [h, 2f] GEMM); RoPE is
    # megatron/core/models/common/rotary_pos_embedding.py apply_rotary_pos_emb's elementwise chain
    # (rotate_half's chunk / negate / cat, t * cos + rotate_half(t) * sin) on q and k; flash attention is
    # flash_attn_varlen_func (FlashAttention-2, causal); RMSNorm is apex's FusedRMSNormAffineFunction
    # (megatron/model/fused_layer_norm.py: one kernel each way, as every profile's); linear biases (where a
    # model has them) are `output + bias` after torch.matmul (LinearWithGradAccumulationAndAsyncCommunication
    # in megatron/core/tensor_parallel/layers.py: no epilogue); bias-dropout-add is the jit-scripted
    # bias_dropout_add (x + bias, F.dropout, residual + out) whose dropout is a separate op in the scripted
    # graph (no fusion of random ops), so the residual add is its own kernel; no Transformer Engine. The same
    # layers.py runs the SP re-gather and overlapped ReduceScatter, and the asynchronous dgrad AllReduce
    # without SP (--no-async-tensor-model-parallel-allreduce unset). Gradients: fused accumulation into FP32
    # main_grad buffers (--no-gradient-accumulation-fusion unset), no copies (the Megatron-Core path).
    "flagscale-2023": _unfused_layer(
        "flagscale-2023",
        bias_in_gemm=False,
        sp_dgrad_overlap=True,
        async_dgrad_allreduce=True,
        flash_layout_copies=True,
        rope_slice_cat=True,
        vocab_divisible_by=128,  # Megatron's tokenizer build (_vocab_size_with_padding) in FlagScale too
    ),
    # InternLM 4a3d156 (InternLM/InternLM, 2023-07-08; internlm/model/modeling_internlm.py, linear.py,
    # multi_head_attention.py, embedding.py): flash-attn 1's fused dense layers (flash_attn.ops.fused_dense:
    # Wqkv and out_proj biases in the cuBLASLt epilogue), FeedForward `w3(F.silu(w1(x)) * w2(x))` (unfused
    # SwiGLU, gate and up as two GEMMs), flash-attn's rotary CUDA kernel applied in place to q and k
    # (rotary_emb.apply_rotary: fused RoPE), flash-attn v1's FlashSelfAttention (attention_kernel fa1), apex
    # MixedFusedRMSNorm on `_residual.float()` (fp32_norm_input; the final norm too, `self.norm(hidden_states.
    # float())`), the loss by flash-attn's CrossEntropyLoss with inplace_backward (internlm/model/loss.py:
    # loss "fused"), dropout modules with the model's drop rates
    # 0 (F.dropout with p = 0 returns its input: no kernel) and the residual adds `_dropped + _residual` and
    # `hidden_states + residual` as separate kernels; no Transformer Engine. Gradients accumulate in the
    # bf16 parameters' .grad by autograd (no main_grad buffer: the hybrid ZeRO optimizer's hooks skip the
    # reduction on every micro-batch but the last, internlm/core/no_pipeline_scheduler.py).
    "internlm": _unfused_layer(
        "internlm",
        bias_in_gemm=True,
        fused_rope=True,
        dropout=False,
        attention_dropout=0.0,
        swiglu_split_gemms=True,
        fp32_norm_input=True,
        loss="fused",
        autograd_grad_accum=True,
        sharded_grad_allreduce=True,
    ),
    # GPT-NeoX (EleutherAI/gpt-neox c560814b, 2022-02-10, the commit that published configs/20B.yml; PyTorch
    # 1.10, DeepSpeed's pipeline engine), with the fusions its 20B.yml turns on. megatron/model/
    # transformer.py: unfused attention on [s, b, np, hn] (baddbmm, FusedScaleMaskSoftmax, dropout, bmm;
    # the context's permute(2, 0, 1, 3).contiguous() and the QKV split's cat backward: attn_layout_copies),
    # whose scaled_upper_triang_masked_softmax kernel serves 16 < s <= 2048 (megatron/model/fused_softmax.py
    # is_kernel_available) when "scaled-upper-triang-masked-softmax-fusion" is true, as in 20B.yml; the QKV
    # projection a ColumnParallelLinear without skip_bias_add (F.linear with the bias on a 3-D input: its
    # own add after the matmul, or addmm's broadcast copy of the bias into the output that the GEMM then
    # reads as C, about the same bytes: bias_in_gemm off, as megatron-2021's same linear); ParallelMLP's bias-GeLU fused by
    # torch.jit when "bias-gelu-fusion" is true, as in 20B.yml (fused_bias_act); bias_dropout_fusion off
    # (neox_args.py default False, not set in 20B.yml): get_bias_dropout_add's eager `x + bias`, dropout and
    # `residual + out` (fused_bias_dropout_add off); RoPE by apply_rotary_pos_emb's rotate_half chain
    # (megatron/model/positional_embeddings.py) and, with rotary_pct < 1, the slices and torch.cat around
    # it (tracegen.ops._rope); ColumnParallelLinear's input gradient all-reduced by
    # copy_to_model_parallel_region after the layer's backward (megatron/mpu/layers.py: no asynchronous
    # all-reduce, no sequence parallelism). Loss: mpu.vocab_parallel_cross_entropy on the FP32 logits
    # (Megatron's). Gradients: DeepSpeed's FP16 engine lets autograd accumulate each micro-batch's
    # gradients in the parameters' FP16 .grad (autograd_grad_accum); ZeRO stage 1 reduces them at the
    # step. Vocabulary padded to make_vocab_size_divisible_by (128, neox_args.py) x TP.
    # With pipe-parallel-size > 1 megatron/training.py runs `model.train_batch()`, DeepSpeed's PipelineEngine
    # (train_step_pipe), here DeeperSpeed eb7f5cff36 (requirements/requirements.txt of c560814b): blocking
    # transfers in TrainSchedule's order, the activation as the rank's 1/TP part (deepspeed_pipe,
    # pp_scatter_gather), the gradient whole (pp_grad_whole). Its ZeRO stage 1 under the pipeline engine:
    # _exec_reduce_grads calls buffered_allreduce_fallback (deepspeed/runtime/engine.py: the FP16 gradients
    # flattened in buckets of 500M elements, divided by DP and all-reduced whole, after the last backward),
    # then FP16_DeepSpeedZeroOptimizer_Stage1.step (zero/stage1.py) updates the rank's 1/DP partition and
    # all-gathers the FP16 parameters: sharded_grad_allreduce.
    # Other GPT-NeoX configs of that commit (2-7B.yml ... 175B.yml) set both fusions false: not modelled.
    "gpt-neox": Framework(
        "gpt-neox",
        "unfused",
        False,
        True,
        False,
        False,
        False,
        False,
        causal_softmax_max_seq=2048,
        attn_layout_copies=True,
        autograd_grad_accum=True,
        vocab_divisible_by=128,
        pp_scatter_gather=True,
        deepspeed_pipe=True,
        pp_grad_whole=True,
        sharded_grad_allreduce=True,
    ),
}
FRAMEWORK_NAMES: tuple[str, ...] = tuple(FRAMEWORKS)
# Without `framework:`: Megatron-Core, what Megatron-LM and NeMo run today (docs/compute.md). Its default
# attention (flash) and fusions reproduce what a spec without the key generated before, plus the kernels
# issue 22 added (dropout, RoPE).
DEFAULT_FRAMEWORK = "megatron-core"


def framework(name: str) -> Framework:
    """The profile called `name` (one of FRAMEWORK_NAMES)."""
    return FRAMEWORKS[name]
