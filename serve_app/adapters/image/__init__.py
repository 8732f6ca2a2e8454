"""Image classification: ``/v1/classify`` over a torchvision (or built-in ResNet) classifier."""
