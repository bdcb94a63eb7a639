"""The recipes of the data regimes, each declared once: the values of the training settings a
run gets when neither the user, the method's recipe nor a preset sets them (docs/recipes.md).
"""

from __future__ import annotations

from typing import Any

from espn.registry import Registry

#: a recipe: values of the training settings declared ``recipe=True``, its ``model``, and
#: ``regime``, the family a method's own recipe is chosen from (``"mnist"``, ``"cifar"``)
Recipe = dict[str, Any]


#: the paper's MNIST recipe (FC1024, RMSprop lr 1e-3, batch 256, 3 pre-train + 4 prune +
#: 3 fine-tune epochs, alpha 0.05) with the authors' 1-epoch warm-up and fine-tuning at a
#: constant 1e-4, stated for tasks of 60000 training images
MNIST: Recipe = {
    "regime": "mnist",
    "model": "fc1024",
    "alpha": 0.05,
    "optimizer": "rmsprop",
    "lr": 1e-3,
    "batch_size": 256,
    "epochs": (3, 4, 3),
    "warmup": 1,
    "finetune_lr": 1e-4,
    "finetune_schedule": "constant",
    "reference_size": 60000,
}
#: the paper's SplitCIFAR100 recipe (Adam with betas (0, 0.999), lr 0.01, batch 128,
#: 60 pre-train + 90 prune + 100 fine-tune epochs with cosine decay from 0.01, alpha 0.1,
#: the reduced ResNet18) and the authors' warm-up (the first 10 pre-training epochs)
CIFAR_TRAINING: Recipe = {
    "regime": "cifar",
    "model": "resnet18-reduced",
    "alpha": 0.1,
    "optimizer": "adam",
    "betas": (0.0, 0.999),
    "lr": 0.01,
    "batch_size": 128,
    "epochs": (60, 90, 100),
    "warmup": 10,
    "finetune_schedule": "cosine",
}
#: the SplitCIFAR100 recipe, its epochs stated for tasks of 2500 training images
CIFAR: Recipe = CIFAR_TRAINING | {"reference_size": 2500}
#: Fashion-MNIST is learned in a few epochs: the CIFAR recipe with the MNIST epoch counts
#: (stated for the MNIST recipe's data size)
FASHION: Recipe = CIFAR_TRAINING | {
    "epochs": MNIST["epochs"],
    "warmup": MNIST["warmup"],
    "reference_size": MNIST["reference_size"],
}
#: the user's own image folders: the CIFAR recipe on torchvision's ResNet50, shorter; no
#: reference data size (the size rule applies with ``--reference-size``)
FOLDERS: Recipe = CIFAR_TRAINING | {"model": "resnet50", "batch_size": 64, "epochs": (10, 15, 15)}
#: the paper's diversity experiment (ImageNet -> CUBS -> ... as image folders): the CIFAR
#: recipe on ResNet50, its epochs taken as given (no reference data size)
IMAGENET: Recipe = CIFAR_TRAINING | {"model": "resnet50"}

#: the recipes ``--recipe`` and presets name: the data regimes (``mnist``, ``cifar``; data
#: espn has never seen gets one of these, see ``espn.api.learner.regime_of``) and the paper's
#: ImageNet-scale one
REGIMES: Registry[Recipe] = Registry("recipe")
REGIMES.register("mnist")(MNIST)
REGIMES.register("cifar")(CIFAR)
REGIMES.register("imagenet")(IMAGENET)
