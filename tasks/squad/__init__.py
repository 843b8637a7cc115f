"""SQuAD v1.1 reading comprehension: the official EM/F1 and two readers from Levy et al.
(2018)'s Table 2 — the DrQA document reader (task ``squad-drqa``) and BiDAF as in AllenNLP
(task ``squad-bidaf``), every recurrent layer taken from the cell registry."""
