"""verl-monitor live dashboard: ``streamlit run dashboards/app.py -- --store PATH``.

Pages (``st.navigation``): Overview, GPUs, Steps & phases, Communication, Rollout, Flags,
Nodes, Job (the job across its attempts). The sidebar's window and refresh selections are
bound to the URL, so a link shares the view.
"""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

# ``streamlit run`` puts only this folder on sys.path; the package root must be importable too.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from dashboards import common  # noqa: E402

# The tab icon is a file of ours: a ":material/...:" page icon makes the browser fetch it from
# fonts.gstatic.com, which fails on an air-gapped cluster (the pages' own icons are in the
# Material Symbols font Streamlit serves itself).
FAVICON = str(Path(__file__).resolve().parent / "static" / "favicon.png")
st.set_page_config(page_title="verl-monitor", page_icon=FAVICON, layout="wide")

PAGES = [
    st.Page("views/overview.py", title="Overview", icon=":material/home:", default=True),
    st.Page("views/gpus.py", title="GPUs", icon=":material/memory:", url_path="gpus"),
    st.Page("views/steps.py", title="Steps & phases", icon=":material/timeline:", url_path="steps"),
    st.Page("views/communication.py", title="Communication", icon=":material/hub:", url_path="communication"),
    st.Page("views/rollout.py", title="Rollout", icon=":material/dynamic_feed:", url_path="rollout"),
    st.Page("views/flags.py", title="Flags", icon=":material/flag:", url_path="flags"),
    st.Page("views/nodes.py", title="Nodes", icon=":material/dns:", url_path="nodes"),
    st.Page("views/job_attempts.py", title="Job", icon=":material/restart_alt:", url_path="job"),
]

nav = st.navigation(PAGES)
common.sidebar()
nav.run()
