"""The protocols `tfperf serve` answers and `tfperf load --url` speaks, one module each holding both sides (the
server's parse and answer, the client's encode and decode), over the rules they share (`tensors`):

  tfserving_rest   TF Serving's REST API: /v1/models/NAME:predict (row format and columnar), status, metadata
  tfserving_grpc   TF Serving's gRPC API: PredictionService (Predict, GetModelMetadata), ModelService's status
  tfserving_messages  its messages and method paths, made without importing TensorFlow
  kserve_v2        KServe's Open Inference Protocol v2 over HTTP: JSON tensors and the binary extension
  kserve_v2_grpc   the same protocol over gRPC (GRPCInferenceService, as Triton serves it)

No sockets here: the server's routes (`tfperf.serving.server`, `grpc_services`) and the client
(`tfperf.serving.endpoint`) do the I/O and call these.
"""
