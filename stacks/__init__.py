"""The Stallwatch CDK app: one thin stack wiring one construct per capability.

app = cdk.App()
add_stacks(app)  # from stacks.application
app.synth()
"""
