"""torch.compile with inductor on PyTorch 2, the forward graph's outputs handed to a callback as it
runs: the first ones the function's own, the rest what the partition saves for backward."""
import torch


def compile_watching_forward(fn, on_forward_outputs):
    """`fn` compiled afresh (no earlier graph's cache) with inductor; each run of its forward graph
    calls `on_forward_outputs(outputs)`."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    def inner(graph, example_inputs, **kwargs):
        compiled = compile_fx_inner(graph, example_inputs, **kwargs)
        if kwargs.get("is_backward"):
            return compiled

        def run(args):
            outs = compiled(args)
            on_forward_outputs(outs)
            return outs
        run._boxed_call = True
        return run

    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True,
                         backend=lambda graph, inputs: compile_fx(graph, inputs, inner_compile=inner))
