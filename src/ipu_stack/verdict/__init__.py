"""The numerical verdict: the host's reference at device precision, the float64 model, each
stage's agreement and the outputs' fidelity, judged by a host side beside the device."""
