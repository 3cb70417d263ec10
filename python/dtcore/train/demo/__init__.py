"""The built-in GPT and its text, what `python -m dtcore.train` trains when no model is given: apart
from the loop, which trains any nn.Module.

gpt (the model, its shape from the model section, its activation memory), data (the shipped
corpus or a file, tokenized by character or byte, and TokenData: each rank's share of the
sequences, epoch by epoch, with exact resume; make_corpus: generated text for the benchmarks and
examples). The benchmarks, examples and tests build the same model and data from here.
"""
