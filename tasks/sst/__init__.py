"""Stanford Sentiment Treebank sentence classification (SST-5 / SST-2) with an InferSent-style
BiLSTM-max classifier: the ``sst`` task plugin (:mod:`.task`), the tree reader (:mod:`.trees`),
the data catalogue, labels and vectors (:mod:`.data`) and the model (:mod:`.model`)."""
