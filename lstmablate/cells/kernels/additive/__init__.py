"""The fast paths of the additive cells whose gates read h_{t-1} through a matrix (``ran``,
``knn-rnn``): the LSTM family's recurrence run on the LSTM − S-RNN − OUT layout each of them
is (``family.py``)."""
