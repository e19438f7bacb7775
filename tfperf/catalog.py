"""The names users pass on the command line, kept free of TensorFlow imports so that parsers load fast."""

MODEL_NAMES: tuple[str, ...] = ("mlp", "cnn", "lenet", "resnet18")
DATASET_NAMES: tuple[str, ...] = ("mnist-5k", "synthetic", "digits", "mnist", "fashion_mnist")
OFFLINE_DATASET = "mnist-5k"
