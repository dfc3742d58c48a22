"""Models to capture: the demos (`demos`, `demo_models`, `hf_models`) and user factories
(`factories`: ``MODULE:FACTORY`` loaded and its result unpacked).
"""
