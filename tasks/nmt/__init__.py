"""Machine translation, Multi30k English -> German, as OpenNMT-py's early-2018 recipe did it.

Levy et al. (ACL 2018), Table 4: OpenNMT's default attentional encoder-decoder with its
recurrent *encoder* replaced by each ablated cell (Levy et al. 2018, §4.4). The pieces:

* :mod:`.data` — the Multi30k task 1 files, the recipe's last-line rule, pairs;
* :mod:`.tokenise` — Moses tokenisation (``tokenizer.perl -a -no-escape``) and detokenisation;
* :mod:`.vocab` — torchtext-style vocabularies (50,000 words + specials, from train);
* :mod:`.batches` — torchtext's pooled length-sorted batches of 64 sentences;
* :mod:`.model` — embeddings, encoder (from the registry), input-feeding decoder with Luong
  "general" global attention, generator;
* :mod:`.search` — greedy decoding and OpenNMT-py's beam search, ``-replace_unk``;
* :mod:`.bleu` — multi-bleu.perl's tokenised BLEU and sacreBLEU on detokenised text;
* :mod:`.task` — the ``nmt`` task plugin.
"""
