"""``model.py`` of the Python-backend repository that customops.export writes (copied there):
runs the model file named by the config's ``customops_model_file`` parameter (TorchScript,
beside this file) through customops' loader. All requests of a batch that Triton's dynamic
batcher formed run as one forward call; a request's error becomes that request's error
response. Tensors pass through DLPack, so bfloat16 and GPU tensors need no copy through numpy.
Runs inside Triton's Python backend (``triton_python_backend_utils`` exists only there)."""

import json
import os

import torch
import triton_python_backend_utils as pb_utils  # noqa: F401  (provided by the Python backend stub)
from torch.utils import dlpack

import customops
from customops.export import load_torchscript
from customops.export._common import one_line_error


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        filename = config["parameters"]["customops_model_file"]["string_value"]
        path = os.path.join(args["model_repository"], args["model_version"], filename)
        if args.get("model_instance_kind") == "GPU":
            self.device = torch.device("cuda", int(args["model_instance_device_id"]))
        else:
            self.device = torch.device("cpu")
        customops.load_library()
        self.model = load_torchscript(path, map_location=str(self.device))
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]

    def execute(self, requests):
        try:
            batches = [
                [
                    torch.from_dlpack(pb_utils.get_input_tensor_by_name(r, n).to_dlpack()).to(self.device)
                    for n in self.inputs
                ]
                for r in requests
            ]
            rows = [b[0].shape[0] for b in batches]
            with torch.inference_mode():
                out = self.model(*(torch.cat(ts) for ts in zip(*batches)))
            outs = [out] if isinstance(out, torch.Tensor) else list(out)
            responses = []
            for parts in zip(*(o.split(rows) for o in outs)):
                tensors = [
                    pb_utils.Tensor.from_dlpack(n, dlpack.to_dlpack(p.contiguous()))
                    for n, p in zip(self.outputs, parts)
                ]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            return responses
        except Exception as e:  # noqa: BLE001 - any model error becomes the requests' error responses
            # One TritonError per response: the backend frees each response's error, and a shared
            # one crashed tritonserver (SIGSEGV) when a batch of several requests failed.
            message = f"customops: {one_line_error(e, with_type=True)}"
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError(message)) for _ in requests]
