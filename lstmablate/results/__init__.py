"""Results: tables beside the paper (report, formats), learning curves (plot), Appendix A
(figures, visualize) and whether a difference is real (significance)."""
