"""The course MLP: depth x [Linear(dim, dim) + ReLU] and its synthetic regression data, both functions of the seed
alone (model.py). Its tensor-parallel split is parallel.tensor.layers.parallelize_mlp."""
