"""Distillation, in one package: the teacher -> student pipeline's plan and step configs
(:mod:`~xdpx.distill.plan`: ``distill/params.yaml``, one config per step, the k-copy subsets),
the transfer set and its labelling by the teacher (:mod:`~xdpx.distill.transfer`), the
teacher's logits files and the distillation loss the trainer's objective uses
(:mod:`~xdpx.distill.teacher`), and the ship rule (:mod:`~xdpx.distill.ship_rule`). The
steps themselves run stages, so they stay in the stage layer (``stages/distill.py``, which
``distill/dvc.yaml`` and the ``xdpx_distill`` flow call).
"""
